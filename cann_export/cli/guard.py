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
from ..safe_text import terminal

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def _emit_error(err: Exception, as_json: bool) -> int:
    if isinstance(err, ExportError):
        code, payload = err.exit_code, err.to_dict()
        text = f"error: {terminal(err)}"
        if payload.get("cause"):
            text += f" (cause: {terminal(payload['cause'])})"
    else:
        code, payload = EXIT_STAGE_FAILED, {"stage": "internal", "message": f"{type(err).__name__}: {gist(err)}"}
        text = (f"error: [internal] {type(err).__name__}: {terminal(gist(err))}. This is a bug in cann-export; "
                "set CANN_EXPORT_DEBUG=1 for a traceback and report it")
    if as_json:
        click.echo(to_json({"ok": False, "error": payload}))
    click.echo(text, err=True)
    return code


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job's timeout, ``kill``): unwound like Ctrl-C, so staging directories are removed."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _catch_sigterm() -> Any:
    """SIGTERM raises Terminated in the main thread while a command runs, unless the process already chose what
    SIGTERM does; returns what restores the previous handler."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None
    signal.signal(signal.SIGTERM, _on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_guarded(as_json: bool, fn: Callable[[], int | None]) -> None:
    """Run a command body and exit with its code (None is 0); an error becomes one message and an exit code
    (with CANN_EXPORT_DEBUG=1 the whole chain of causes, with tracebacks, goes to stderr first). SIGTERM and
    Ctrl-C unwind the command (its staging is removed) and exit 143 / 130."""
    restore = _catch_sigterm()
    try:
        code = fn() or 0
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise  # click's own usage errors and ctx.exit(): click reports them and picks the exit code
    except BrokenPipeError:  # `cann-export plugins | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is quiet too
        code = EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - every error becomes one message and an exit code
        if os.environ.get("CANN_EXPORT_DEBUG"):
            import traceback

            click.echo("".join(traceback.format_exception(e)), err=True, nl=False)
        code = _emit_error(e, as_json)
    except KeyboardInterrupt as e:
        click.echo(f"{'terminated' if isinstance(e, Terminated) else 'interrupted'} (an artifact is only ever "
                   "renamed into place whole: nothing partial is left)", err=True)
        code = 143 if isinstance(e, Terminated) else 130
    finally:
        restore()
    sys.exit(code)


def guard(cmd: click.Command) -> None:
    """Run ``cmd``'s callback under ``run_guarded`` (once); its ``--json`` flag, whatever the parameter is
    called, picks the error's form. A group's commands are guarded too, at any depth."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            guard(sub)
        if not isinstance(cmd, GuardedGroup):  # so commands added to it later are guarded as well
            cmd.__class__ = type("Guarded" + type(cmd).__name__, (GuardedGroup, type(cmd)), {})
        return  # a group's own callback runs before its subcommand: never exit there
    if cmd.callback is None or getattr(cmd.callback, "_cann_guarded", False):
        return
    callback = cmd.callback
    as_json = next((p.name for p in cmd.params if "--json" in getattr(p, "opts", ())), None)

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> None:
        run_guarded(bool(as_json and kwargs.get(as_json)), lambda: callback(*args, **kwargs))

    run._cann_guarded = True  # type: ignore[attr-defined]
    cmd.callback = run


class GuardedGroup(click.Group):
    """A group whose every command (added by decorator or ``add_command``) runs guarded; its subgroups made
    with ``.group()`` are GuardedGroups too."""

    group_class = type

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        guard(cmd)
        super().add_command(cmd, name)


class DefaultCommandGroup(GuardedGroup):
    """``cann-export MODEL ...`` means ``cann-export export MODEL ...``."""

    group_class = GuardedGroup

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and (not args[0].startswith("-") and args[0] not in self.commands
                     or args[0] == "--model" or args[0].startswith("--model=")):
            args = ["export", *args]
        return super().parse_args(ctx, args)

