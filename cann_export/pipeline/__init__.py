"""The export pipeline: the stage table (``table.STAGES``) and ``run``, which runs it."""
from __future__ import annotations

from .runner import run

__all__ = ["run"]
