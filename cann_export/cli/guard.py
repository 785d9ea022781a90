"""The CLI's error guard: every command, a plugin's included, turns errors into one message and an exit
code, never a traceback. The group applies it to each command it is given, so plugins never import it."""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ..errors import EXIT_STAGE_FAILED, ExportError, gist
from ..fs.jsonio import dumps as to_json

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def _emit_error(err: Exception, as_json: bool) -> int:
    if isinstance(err, ExportError):
        code, payload = err.exit_code, err.to_dict()
        text = f"error: {err}"
        if payload.get("cause"):
            text += f" (cause: {payload['cause']})"
    else:
        code, payload = EXIT_STAGE_FAILED, {"stage": "internal", "message": f"{type(err).__name__}: {gist(err)}"}
        text = (f"error: [internal] {type(err).__name__}: {gist(err)}. This is a bug in cann-export; "
                "set CANN_EXPORT_DEBUG=1 for a traceback and report it")
    if as_json:
        click.echo(to_json({"ok": False, "error": payload}))
    click.echo(text, err=True)
    return code


def run_guarded(as_json: bool, fn: Callable[[], int | None]) -> None:
    """Run a command body and exit with its code (None is 0); an error becomes one message and an exit code
    (with CANN_EXPORT_DEBUG=1 the whole chain of causes, with tracebacks, goes to stderr first)."""
    try:
        code = fn() or 0
    except BrokenPipeError:  # `cann-export plugins | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is quiet too
        code = EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - every error becomes one message and an exit code
        if os.environ.get("CANN_EXPORT_DEBUG"):
            import traceback

            click.echo("".join(traceback.format_exception(e)), err=True, nl=False)
        code = _emit_error(e, as_json)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        code = 130
    sys.exit(code)


def guarded(callback: Callable[..., Any]) -> Callable[..., Any]:
    """A command callback run under ``run_guarded``; its ``as_json`` parameter picks the error's form."""
    if getattr(callback, "_cann_guarded", False):
        return callback

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> None:
        run_guarded(bool(kwargs.get("as_json")), lambda: callback(*args, **kwargs))

    run._cann_guarded = True  # type: ignore[attr-defined]
    return run


class GuardedGroup(click.Group):
    """A group whose every command (added by decorator or ``add_command``) runs guarded; its subgroups made
    with ``.group()`` are GuardedGroups too."""

    group_class = type

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                if not isinstance(sub, click.Group) and sub.callback is not None:
                    sub.callback = guarded(sub.callback)
            if not isinstance(cmd, GuardedGroup):
                cmd.__class__ = type("Guarded" + type(cmd).__name__, (GuardedGroup, type(cmd)), {})
        elif cmd.callback is not None:
            cmd.callback = guarded(cmd.callback)
        super().add_command(cmd, name)


class DefaultCommandGroup(GuardedGroup):
    """``cann-export MODEL ...`` means ``cann-export export MODEL ...``."""

    group_class = GuardedGroup

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["export", *args]
        return super().parse_args(ctx, args)
