"""Fault injection for the crash tests: ``CANN_MODEL_ZOO_FAULT=POINT`` kills the process with SIGKILL at
the named point of a publish; ``POINT:sleep=SECONDS`` sleeps there instead (so a test can kill it)."""
from __future__ import annotations

import os

ENV = "CANN_MODEL_ZOO_FAULT"
POINTS = ("copy", "staged", "manifest", "renamed", "committed")


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        target, _, action = item.partition(":")
        if target != name:
            continue
        if action.startswith("sleep="):
            import time

            time.sleep(float(action.split("=", 1)[1]))
        else:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
