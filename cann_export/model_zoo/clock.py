"""Who and when, for manifests and the alias log (a leaf module: the stores and the API both use it)."""
from __future__ import annotations

import datetime as _dt
import getpass
import os
import socket


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def who() -> str:
    user = os.environ.get("CANN_MODEL_ZOO_USER")
    if user:
        return user
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
