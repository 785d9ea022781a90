"""The whole command tree, with the commands the default plugins register, for the generated CLI
reference (docs/reference/cli.md, mkdocs-click); the `cann-export` entry point builds the same tree."""
from __future__ import annotations

from ..hooks.manager import registry
from .main import cli

registry().add_commands(cli)

__all__ = ["cli"]
