"""Files a user names (a model, --example-inputs, --parity-data, --calibration-data) must be regular files,
checked before any byte is read: a device (/dev/zero reads forever), a FIFO (blocks until a writer comes), a
socket or a directory is never one, and each is refused naming what it is."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ExportError, LoadError


def kind_of(mode: int) -> str:
    """What a stat mode names, in words (for a refusal)."""
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a directory" if stat.S_ISDIR(mode) else "not a regular file")


def check_regular_file(path: Path | str, what: str, hint: str, error: type[ExportError] = LoadError) -> None:
    """Refuse ``path`` (an ``error`` naming ``what`` and the path, ending with ``hint``) unless it is a regular
    file; a link to one is fine. Only ``os.stat`` runs: nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as e:
        raise error(f"the {what} was not found. {hint}", path=str(path)) from e
    except OSError as e:
        raise error(f"cannot stat the {what} ({e.strerror or e}); check the path", path=str(path)) from e
    if not stat.S_ISREG(mode):
        raise error(f"the {what} is {kind_of(mode)}, not a regular file; nothing was read. {hint}", path=str(path))
