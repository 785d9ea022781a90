"""The one property every untrusted-input reader keeps under fuzzing, and the fuzzer's time budget.

A reader given any bytes either succeeds or raises an ``ExportError`` (a clean refusal that renders); any
other exception is a bug. While it runs, nothing is executed that the input could have asked for: a process
started, a shared object dlopen()ed (audit events, refused and recorded) or the payloads' marker file
created; its peak resident memory stays within ``MEMORY_LIMIT`` of where it started; and it returns
within ``TIME_LIMIT`` seconds.

Budget: each fuzz test runs a fixed number of derandomized examples (reproducible in CI). With
``CANN_EXPORT_FUZZ_SECONDS=N`` each one instead draws fresh random batches for N seconds.
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from cann_export.errors import ExportError

MEMORY_LIMIT = 256 << 20  # bytes of peak RSS a reader may add while reading one small artifact
ADDRESS_SPACE_MARGIN = 4 << 30  # virtual memory a reader call may map beyond what the process holds
TIME_LIMIT = 5  # seconds one reader call may take (a healthy one: well under 1 s); a hang is a bug too
FUZZ_SECONDS = float(os.environ.get("CANN_EXPORT_FUZZ_SECONDS") or 0)

# Audit events of code the input could make run: none of them fires while a healthy artifact is read.
FORBIDDEN_EVENTS = frozenset({
    "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "socket.connect", "webbrowser.open"})

_BASE = dict(deadline=None, database=None, print_blob=True, suppress_health_check=list(HealthCheck))


class PayloadRan(BaseException):  # noqa: N818 - BaseException: no reader's `except Exception` swallows it
    """Raised (and recorded) by the audit hook when a reader is about to run something."""


class ReaderHung(BaseException):  # noqa: N818
    """A reader call still running after ``Guard.time_limit`` seconds; its argument: where it was stuck (the
    innermost cann_export frame, ``validators/parity.py:run_onnx``)."""


class Guard:
    """Watches one reader call at a time (``with guard.watching(): ...``); ``marker`` is the file every
    payload of the corpus would create."""

    def __init__(self) -> None:
        self.time_limit = TIME_LIMIT
        self.root = Path(tempfile.mkdtemp(prefix="cann-fuzz-"))
        self.marker = self.root / "PAYLOAD-RAN"
        self.events: list[str] = []
        self._armed = False
        sys.addaudithook(self._hook)  # for the rest of the process; inert unless armed

    def _hook(self, event: str, args: tuple) -> None:
        if not self._armed:
            return
        if event in FORBIDDEN_EVENTS or self._is_payload(event, args):
            self.events.append(f"{event}{str(args)[:200]}")
            raise PayloadRan(event)

    def _is_payload(self, event: str, args: tuple) -> bool:
        """The marker opened (``Path.touch``), or code naming it executed (sympify's eval, guards_code's exec);
        source only parsed (``ast.parse``, a checker reading guards_code) runs nothing and is not flagged."""
        if event == "open":
            return str(args[0]) == str(self.marker)
        if event == "exec":
            return _names(args[0], self.marker.name)
        return False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Arm the audit hook and a watchdog around the block; afterwards check what it did. A block still
        running after ``time_limit`` seconds is interrupted and raises ``ReaderHung`` naming where it was."""
        self.events.clear()
        self.hung_at = None
        start = _reset_peak_rss()
        limits = _cap_address_space()
        previous = signal.signal(signal.SIGALRM, self._interrupted)
        watchdog = threading.Timer(self.time_limit, self._timed_out, (threading.main_thread().ident,))
        self._armed = True
        watchdog.start()
        try:
            yield
        except (PayloadRan, ReaderHung):
            pass  # recorded in self.events / self.hung_at
        finally:
            self._armed = False
            watchdog.cancel()
            signal.signal(signal.SIGALRM, previous)
            if limits is not None:
                resource.setrlimit(resource.RLIMIT_AS, limits)
        if self.hung_at is not None:
            raise ReaderHung(self.hung_at)
        assert not self.events, f"the input made the reader run code: {self.events}"
        assert not self.marker.exists(), "a payload ran: its marker file exists"
        grown = _peak_rss() - start
        assert grown <= MEMORY_LIMIT, f"the reader's peak memory grew by {grown >> 20} MiB"

    def _timed_out(self, main: int) -> None:
        """(the watchdog thread) Note where the reader is stuck, then interrupt its blocking call."""
        frame = sys._current_frames().get(main)
        stack = traceback.extract_stack(frame) if frame is not None else []
        self.hung_at = next((f"{Path(f.filename).as_posix().split('/cann_export/')[-1]}:{f.name}"
                             for f in reversed(stack) if "/cann_export/" in Path(f.filename).as_posix()), "?")
        signal.pthread_kill(main, signal.SIGALRM)

    def _interrupted(self, signum: int, frame: Any) -> None:
        if self._armed:
            raise ReaderHung(self.hung_at)


def _cap_address_space() -> tuple[int, int] | None:
    """Cap the address space at ``ADDRESS_SPACE_MARGIN`` above its size now, so that a runaway allocation
    is a MemoryError (a finding) instead of the kernel's OOM killer; returns the limits to restore."""
    size = _status_kib("VmSize")
    if size is None:
        return None
    limits = resource.getrlimit(resource.RLIMIT_AS)
    cap = (size << 10) + ADDRESS_SPACE_MARGIN
    if limits[1] != resource.RLIM_INFINITY:
        cap = min(cap, limits[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, limits[1]))
    return limits


def _names(code: Any, text: str) -> bool:
    """Whether a code object (or one nested in it) holds a constant string containing ``text``."""
    stack = [code]
    while stack:
        item = stack.pop()
        for const in getattr(item, "co_consts", ()):
            if isinstance(const, str) and text in const:
                return True
            if hasattr(const, "co_consts"):
                stack.append(const)
    return False


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> int:
    """Reset the peak-RSS mark where Linux allows it (``clear_refs`` 5) and return the bytes resident now;
    elsewhere the process's lifetime peak (``ru_maxrss``), so only growth past it is seen."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        now = _status_kib("VmRSS")
        if now is not None:
            return now << 10
    return _peak_rss()


def _peak_rss() -> int:
    peak = _status_kib("VmHWM")
    if peak is not None:
        return peak << 10
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class KnownBug(ExportError):
    """A reader's non-ExportError listed in the known bugs (reported, fixed elsewhere): counted, not failed."""

    stage = "known bug"


def escaped_from(e: BaseException) -> tuple[str, str]:
    """(the exception's qualified type, the last cann_export frame it passed: ``bundle/read.py:open_bundle``)."""
    kind = f"{type(e).__module__}.{type(e).__qualname__}"
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = Path(frame.filename).as_posix()
        if "/cann_export/" in path:
            return kind, f"{path.split('/cann_export/')[-1]}:{frame.name}"
    return kind, "?"


def clean(call: Callable[[], Any], guard: Guard,
          known: dict[tuple[str, str], str] | None = None) -> ExportError | None:
    """Run one reader call under ``guard``: ``None`` when it succeeded, the ``ExportError`` when it refused
    (which must render as a message and a dict). Any other exception propagates (that is the bug), and a hang
    is an AssertionError, unless ``known`` lists it (type or "hang", where it escaped): then a ``KnownBug``."""
    known = known or {}
    try:
        with guard.watching():
            refusal = None
            try:
                call()
            except ExportError as e:
                refusal = e
            except Exception as e:
                reason = known.get(escaped_from(e))
                if reason is None:
                    raise
                refusal = KnownBug(reason)
    except ReaderHung as e:
        if ("hang", e.args[0]) in known:
            return KnownBug(known["hang", e.args[0]])
        raise AssertionError(f"the reader hung (still running after {guard.time_limit} s in {e.args[0]})") from None
    if refusal is not None:
        assert str(refusal) and isinstance(refusal.to_dict()["message"], str)
    return refusal


REACHED: Counter[str] = Counter()


def reached(refusal: ExportError | None) -> str:
    """How far an input got (counted in REACHED, which ``fuzz`` prints: ``pytest -s`` shows it)."""
    if refusal is None:
        what = "loaded"
    else:
        words = re.sub(r"'[^']*'|\d+", "_", " ".join(refusal.message.split()[:6]))
        what = f"refused by {type(refusal).__name__}: {words[:60]}"
    REACHED[what] += 1
    return what


def outcome(call: Callable[[], Any], guard: Guard, known: dict[tuple[str, str], str]) -> str:
    """``"loaded"``, ``"refused"``, ``"known bug: ..."`` or the bug: the exception, where it escaped from."""
    try:
        refusal = clean(call, guard, known)
    except Exception as e:  # noqa: BLE001 - the bug being reported
        kind, where = escaped_from(e)
        return f"{kind} escaped from {where}: {str(e)[:300]}"
    if isinstance(refusal, KnownBug):
        return f"known bug: {refusal.message}"
    return "loaded" if refusal is None else "refused"


def check_corpus(cases: dict[str, Callable[[], Any]], accepted: set[str], known: dict[tuple[str, str], str],
                 guard: Guard) -> set[str]:
    """Every crafted case refused (those in ``accepted`` loaded), or hitting a known bug: the known bugs
    hit are returned (a test expects its own, so that a fixed one leaves the list)."""
    wrong, hits = [], set()
    for label, call in cases.items():
        got = outcome(call, guard, known)
        if got.startswith("known bug: "):
            hits.add(got.removeprefix("known bug: "))
        elif got != ("loaded" if label in accepted else "refused"):
            wrong.append(f"{label}: {got}")
    assert not wrong, "\n".join(wrong)
    return hits


def fuzz(check: Callable[[], None], examples: int) -> None:
    """Run the ``@given`` test ``check``: ``examples`` derandomized examples, or with
    ``CANN_EXPORT_FUZZ_SECONDS`` random batches of that size until that many seconds have passed."""
    REACHED.clear()
    start = time.monotonic()
    check = settings(max_examples=examples, derandomize=not FUZZ_SECONDS, **_BASE)(check)
    check()
    while time.monotonic() - start < FUZZ_SECONDS:  # derandomize off: each batch draws new inputs
        check()
    name = getattr(getattr(check, "hypothesis", None), "inner_test", check).__qualname__.split(".")[0]
    print(f"\n{name}: {sum(REACHED.values())} inputs in {time.monotonic() - start:.1f} s")
    for what, count in REACHED.most_common():
        print(f"  {count:6d}  {what}")
