"""Run a command under a resident-memory cap: its process tree's peak RSS (each process's VmHWM, summed over
the processes alive at a sample) is sampled while it runs, and the tree is killed as soon as it passes the cap,
so a regression that would take 11 GB fails the test without taking the machine down with it."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Capped:
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int  # the largest sampled sum of the tree's VmHWM
    killed: bool  # the cap (or the deadline) was reached and the tree was killed


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return pids


def _hwm_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_capped(args: list[str], env: dict[str, str], cap_bytes: int, timeout: float = 180) -> Capped:
    """Run ``args`` in its own process group; kill the group when the tree's peak RSS passes ``cap_bytes``."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    peak, killed, deadline = 0, False, time.monotonic() + timeout
    while proc.poll() is None:
        peak = max(peak, sum(_hwm_bytes(p) for p in _tree(proc.pid)))
        if peak > cap_bytes or time.monotonic() > deadline:
            killed = True
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    return Capped(proc.returncode, stdout, stderr, peak, killed)
