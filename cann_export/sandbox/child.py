"""Run a function in a forked, confined child and bring back only JSON: progress events, then a result or
an error. Nothing the child sends is unpickled or executed; the parent reads at most ``MAX_MESSAGE_BYTES``
per message and rebuilds errors from the classes cann_export.errors declares.

The child is a fork (torch and the plugins are already imported, so it starts in milliseconds); it confines
itself before running anything, and leaves with ``os._exit`` so no handler of the parent's runs twice."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import errors
from . import confine

MAX_MESSAGE_BYTES = 256 << 20
Send = Callable[[dict[str, Any]], None]
_FRESH: list[bool] = []  # note_process_start() saw a process of one thread


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 2  # unknown: assume threads


def note_process_start() -> None:
    """Called first thing by a program's entry point (the CLI's main): a process of one thread has no
    OpenMP pool yet, so a child forked before any torch computation may use every thread."""
    _FRESH[:] = [_threads() == 1]


def fork_keeps_threads() -> bool:
    """Whether a child forked now may run torch on several threads. GNU OpenMP (torch's intra-op pool)
    hangs in a forked child once the parent ran a parallel region; a process of one thread, or one whose
    entry point noted it started with one, has not."""
    return bool(_FRESH and _FRESH[0]) or _threads() == 1


class ChildFailed(RuntimeError):
    """The child ended without a result: killed by a signal, or its messages were not readable."""


def _writer(fd: int) -> Send:
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        data = (json.dumps(message, allow_nan=False, default=str) + "\n").encode()
        with lock:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
    return send


def _error_message(e: BaseException) -> dict[str, Any]:
    inner = errors.innermost_cause(e)
    out: dict[str, Any] = {"mro": [c.__name__ for c in type(e).__mro__], "type": type(e).__name__,
                           "message": errors.one_line(e, 4000)}
    if isinstance(e, errors.ExportError):
        out.update(message=e.message, path=e.path, stage=e.stage, exit_code=e.exit_code)
    if inner is not e:
        out["cause"] = [type(inner).__name__, errors.one_line(inner, 4000)]
    return out


def _mute() -> None:
    """The child's stdout and stderr go to /dev/null: what the confined code prints (``::error::`` or
    ``::add-mask::`` for a CI runner, terminal escapes) never reaches the user's terminal or CI log; the child
    speaks only through its pipe, as data. (CANN_EXPORT_DEBUG keeps them, with the child's traceback.) Text the
    parent had buffered, copied by the fork, is flushed there too: it is the parent's to write, once."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _own_streams() -> None:
    """The child writes through the process's own streams. A parent showing a live line (rich's Live) had replaced
    sys.stdout / sys.stderr, and the stream of each logging handler made meanwhile, by proxies to its console, whose
    lock the parent's refresh thread may hold at the fork: that thread is not in the child, so the first line the
    child wrote (a library's warning at import) waited on the lock forever."""
    import logging

    real = (sys.__stdout__, sys.__stderr__)
    if real[0] is not None and real[1] is not None:
        sys.stdout, sys.stderr = real
    loggers = [logging.getLogger(), *(found for found in list(logging.Logger.manager.loggerDict.values())
                                      if isinstance(found, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
                    and handler.stream not in real and sys.__stderr__ is not None:
                handler.stream = sys.__stderr__  # not setStream: it flushes the proxy first


def _child(fd: int, writable: list[Path], support: confine.Support, body: Callable[[Send], dict[str, Any]],
           keep_threads: bool) -> None:
    _own_streams()
    send = _writer(fd)
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the CLI's handler unwinds the parent; the child just dies
        if not os.environ.get("CANN_EXPORT_DEBUG"):
            import faulthandler

            faulthandler.disable()  # a crash here is reported by the parent, not as a dump of the caller's stack
            _mute()
        if not keep_threads and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)  # the parent's OpenMP pool did not survive the fork
        confine.confine(writable, support)
        send({"result": body(send)})
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as data
        if os.environ.get("CANN_EXPORT_DEBUG"):
            traceback.print_exception(e, file=sys.stderr)
        try:
            send({"error": _error_message(e)})
        except BaseException:  # noqa: BLE001 - the pipe is gone: the parent reports the exit code
            code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run(body: Callable[[Send], dict[str, Any]], writable: list[Path], support: confine.Support,
        on_event: Callable[[dict[str, Any]], None], keep_threads: bool | None = None) -> dict[str, Any]:
    """``body(send)`` in a confined child; each ``send``-ed event reaches ``on_event`` here; its return
    value comes back. An error the child raised is raised here, rebuilt (see ``rebuild``). ``keep_threads``:
    ``fork_keeps_threads()`` asked before the caller imported libraries for the child to inherit (an import
    starts threads of its own, never an OpenMP pool); asked now when None."""
    keep_threads = fork_keeps_threads() if keep_threads is None else keep_threads
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_fd)
        _child(write_fd, writable, support, body, keep_threads)
    os.close(write_fd)
    outcome: dict[str, Any] | None = None
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            while line := pipe.readline(MAX_MESSAGE_BYTES + 1):
                message = _parse(line)
                if "result" in message or "error" in message:
                    outcome = message
                else:
                    on_event(message)
    except BaseException:
        _kill(pid)
        raise
    status = _wait(pid)
    if outcome is None:
        raise ChildFailed(_describe_status(status))
    if "error" in outcome:
        raise rebuild(outcome["error"])
    result = outcome["result"]
    if not isinstance(result, dict):
        raise ChildFailed("the sandboxed child sent a result that is not an object")
    return result


def _parse(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_MESSAGE_BYTES or not line.endswith(b"\n"):
        raise ChildFailed(f"the sandboxed child sent a message over {MAX_MESSAGE_BYTES} bytes or cut short")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ChildFailed(f"the sandboxed child sent unreadable data ({type(e).__name__})") from e
    if not isinstance(message, dict):
        raise ChildFailed("the sandboxed child sent a message that is not an object")
    return message


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _wait(pid)


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (out of memory?)" if sig == signal.SIGKILL else ""
        return f"the sandboxed child was killed by {name}{hint} before it finished"
    return f"the sandboxed child exited with status {os.WEXITSTATUS(status)} without a result"


def _remote(type_name: Any, text: Any) -> Exception:
    """An exception standing for one raised in the child: its class carries the child's type name (a plain
    identifier, nothing is imported) so messages read as they would in-process."""
    name = str(type_name) if str(type_name).isidentifier() and len(str(type_name)) <= 80 else "ChildError"
    return type(name, (Exception,), {"__module__": "cann_export.sandbox.child"})(str(text)[:4000])


def rebuild(data: Any) -> BaseException:
    """The child's error as the first class of its MRO that cann_export.errors declares (an ExportError
    subclass), with its message, path, stage and cause; otherwise a stand-in of the child's type."""
    if not isinstance(data, dict):
        return ChildFailed("the sandboxed child sent an unreadable error")
    message = str(data.get("message", ""))[:8000]
    cls = next((getattr(errors, n) for n in data.get("mro", []) if isinstance(n, str)
                and isinstance(getattr(errors, n, None), type) and issubclass(getattr(errors, n), errors.ExportError)),
               None)
    if cls is None:
        return _remote(data.get("type"), message)
    path, stage = data.get("path"), data.get("stage")
    err = cls(message, path=str(path) if path is not None else None, stage=str(stage) if stage else None)
    if data.get("exit_code") in (errors.EXIT_USER_ERROR, errors.EXIT_STAGE_FAILED):
        err.exit_code = data["exit_code"]  # a subclass the child raised (AtcError: a stage failure)
    cause = data.get("cause")
    if isinstance(cause, list) and len(cause) == 2:
        err.__cause__ = _remote(cause[0], cause[1])
    return err
