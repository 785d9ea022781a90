"""Report files a user names (``--summary``, ``--junit``, ``--trace``), checked before the export runs: the target
is absent or a regular file (a device, FIFO, socket or directory is refused: ``--trace /dev/full`` would otherwise
have its device node replaced by an atomic rename), and a file can be created in the nearest directory that
exists (probed by creating and removing one: ``/proc/self/...`` passes a permission check as root, not a create).
Missing parent directories are still made when the report is written."""
from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

from ..errors import ExportError, OptionsError
from .regular import kind_of

HINT = "pass a file name in a directory you can write (e.g. reports/{name})"


def check_report_path(path: str | Path, flag: str, error: type[ExportError] = OptionsError) -> Path:
    """``path`` as a Path when a report can be written there; else ``error`` naming ``flag`` and the path."""
    target = Path(path)
    hint = HINT.format(name={"--junit": "junit.xml", "--trace": "trace.json"}.get(flag, "summary.md"))
    if not str(path) or target.name in ("", ".", ".."):
        raise error(f"{flag} {str(path)[:200]!r} names no file; {hint}", path=str(path))
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise error(f"{flag}: cannot stat the report file ({e.strerror or e}); {hint}", path=str(path)) from e
    if mode is not None and not stat.S_ISREG(mode):
        raise error(f"{flag}: the report file is {kind_of(mode)}, not a regular file; nothing was written. {hint}",
                    path=str(path))
    directory = _nearest_directory(target.absolute().parent, flag, hint, error, str(path))
    probe = directory / f".{target.name[:64]}.cann-probe-{uuid.uuid4().hex[:8]}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise error(f"{flag}: cannot create a file in {str(directory)[:200]} ({e.strerror or e}); {hint}",
                    path=str(path)) from e
    return target


def _nearest_directory(parent: Path, flag: str, hint: str, error: type[ExportError], shown: str) -> Path:
    """``parent`` or its nearest existing ancestor, which must be a directory."""
    for candidate in (parent, *parent.parents):
        try:
            mode = os.stat(candidate).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise error(f"{flag}: cannot stat {str(candidate)[:200]} ({e.strerror or e}); {hint}", path=shown) from e
        if not stat.S_ISDIR(mode):
            what = "a regular file" if stat.S_ISREG(mode) else kind_of(mode)
            raise error(f"{flag}: {str(candidate)[:200]} is {what}, not a directory; {hint}", path=shown)
        return candidate
    raise error(f"{flag}: no directory of the path exists; {hint}", path=shown)
