"""Crash points for the zoo's kill -9 tests, kept out of the product: a child process runs the CLI with one
function of the zoo patched so that, when the publish reaches that point, it writes a marker file and then
SIGKILLs itself (or sleeps there, so the test can kill it from outside at a known moment).

The test asserts the marker: a kill that happened anywhere else (an import error, an earlier exit) fails
instead of passing for the wrong reason."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Point:
    """Patch ``owner.attr`` (``owner`` a module, or ``module:Class``); crash ``when`` it is called
    ("before" the call, or "after" it returns) the ``nth`` time."""

    owner: str
    attr: str
    when: str = "after"
    nth: int = 1


LOCAL = "cann_export.model_zoo.local:LocalStore"
# Each point of a publish, in order, named by the function the product calls there.
POINTS = {
    # the first block of a weights file is written (the copy's writeback hook runs after every block)
    "copy": Point("cann_export.model_zoo.file_copies", "_START_WRITEBACK"),
    # every staged file is on disk and hashed, no manifest yet
    "staged": Point("cann_export.model_zoo.file_copies", "file_table"),
    # manifest.json written into staging, not yet renamed into models/
    "manifest": Point("cann_export.model_zoo.local", "write_json"),
    # the version directory renamed into place (and its parent fsynced), no index row yet
    "renamed": Point("cann_export.model_zoo.local", "fsync_dir"),
    # the index transaction committed, the row not yet read back
    "committed": Point(LOCAL, "_get_row", when="before"),
    # remote store: every blob uploaded, the version's manifest not yet created
    "remote-staged": Point("cann_export.model_zoo.remote:RemoteStore", "_create", when="before"),
}

_SCRIPT = """\
import importlib, os, signal, sys, time
owner_spec, attr, when, nth, marker, label, sleep = {params!r}
module, _, cls = owner_spec.partition(":")
owner = importlib.import_module(module)
if cls:
    owner = getattr(owner, cls)
real = getattr(owner, attr)
calls = [0]

def reach():
    with open(marker, "w") as f:
        f.write(label)
    if sleep:
        time.sleep(sleep)
    os.kill(os.getpid(), signal.SIGKILL)

def patched(*args, **kwargs):
    calls[0] += 1
    hit = calls[0] == nth
    if hit and when == "before":
        reach()
    out = real(*args, **kwargs) if real is not None else None
    if hit and when == "after":
        reach()
    return out

setattr(owner, attr, patched)
from cann_export.cli.main import main
sys.argv = ["cann-export", *sys.argv[1:]]
main()
"""


def command(point: str, marker: Path, cli_args: list[str], sleep: float = 0.0) -> list[str]:
    """The argv of a child that runs ``cann-export CLI_ARGS`` and crashes at ``point`` (see POINTS)."""
    p = POINTS[point]
    params = (p.owner, p.attr, p.when, p.nth, str(marker), point, sleep)
    return [sys.executable, "-c", _SCRIPT.format(params=params), *cli_args]


def run(point: str, marker: Path, cli_args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run the child to its crash; the caller asserts ``returncode == -SIGKILL`` and ``reached(marker, point)``."""
    return subprocess.run(command(point, marker, cli_args), capture_output=True, text=True, timeout=120,
                          check=False, **kwargs)


def reached(marker: Path, point: str) -> bool:
    """Whether the child wrote the marker of ``point`` (so the crash happened there)."""
    return marker.is_file() and marker.read_text() == point
