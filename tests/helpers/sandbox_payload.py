"""A model file whose unpickling tries what the load sandbox forbids, then yields a working model.

``Escape(outside, port)`` unpickles (only with --trust-pickle: it is code) by calling ``attempt``: it writes
``outside/written`` (a file outside any staging directory), connects to ``127.0.0.1:port`` and sends
b"escaped", and runs ``touch outside/executed`` through a shell; each attempt that fails is skipped. It
returns the toy MLP, so the export goes on. Confined, none of the three leaves a trace."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from pathlib import Path

from .toy_models import make_mlp


def attempt(outside: str, port: int):
    with contextlib.suppress(OSError):
        Path(outside, "written").write_text("the load wrote outside its staging directory")
    with contextlib.suppress(OSError):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"escaped")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["/bin/sh", "-c", f"touch {outside}/executed"], check=False, timeout=10)
    with contextlib.suppress(OSError):
        os.system(f"touch {outside}/system")
    return make_mlp().eval()


class Escape:
    def __init__(self, outside: Path, port: int):
        self.outside, self.port = str(outside), port

    def __reduce__(self):
        return (attempt, (self.outside, self.port))


def crash():
    """Unpickling ends the process with SIGSEGV (a crafted file that crashes the loader)."""
    import ctypes

    ctypes.string_at(0)


class Crash:
    def __reduce__(self):
        return (crash, ())
