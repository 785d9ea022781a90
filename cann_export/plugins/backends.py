"""Built-in backends (cpu, cuda, npu, npu-sim) and the ``cann-export backends`` command."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from ..hooks.specs import hookimpl
from ..safe_text import terminal


@hookimpl
def register_backends(register: Callable[[Any], None]) -> None:
    from ..backend.registry import builtin_backends

    for backend in builtin_backends():
        register(backend)


@hookimpl
def register_commands(cli: Any) -> None:
    from ..usage.examples import examples

    @cli.command("backends", epilog=examples("cann-export backends", "cann-export backends --json"))
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON list instead of a table.")
    def backends_command(as_json: bool) -> None:
        """List the devices models can run on, and why unavailable ones are not."""
        from ..backend.registry import describe

        rows = describe()
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        for row in rows:
            mark = "yes" if row["available"] else "no "
            click.echo(terminal(f"{row['name']:<8} {mark}  {row['device']:<5} {row['reason']}"))
