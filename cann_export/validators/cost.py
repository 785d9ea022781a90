"""What the checks cost: the wall seconds of the stages that build the parity sets with their eager reference
(``prepare``) and run them through onnxruntime (``validate``), and the process's peak RSS with how much of it
came in those stages (``ru_maxrss`` only grows: the growth over a stage is the memory that stage added on top of
everything before it). The manifest keeps it as ``parity.checks``; the CLI prints it on its own line."""
from __future__ import annotations

import sys
from typing import Any

CHECK_STAGES = ("prepare", "validate")
ORDER = ("load", "prepare", "train", "strip", "capture", "optimize", "annotate", "lint", "write", "validate")


def peak_mib() -> float:
    """This process's peak resident set so far, MiB."""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round((kib / 1024 if sys.platform == "darwin" else kib) / 1024, 1)


def checks_record(seconds: dict[str, float], peaks: dict[str, float]) -> dict[str, Any] | None:
    """``parity.checks``: the checks' wall seconds, the process's peak RSS (MiB) and the MiB the checks' stages
    raised it by; None when validate did not run."""
    if "validate" not in peaks:
        return None
    added, before = 0.0, 0.0
    for stage in ORDER:
        if stage not in peaks:
            continue
        if stage in CHECK_STAGES:
            added += max(0.0, peaks[stage] - before)
        before = max(before, peaks[stage])
    # to 0.1 ms: a tiny model's checks take a few ms on a fast machine, which two decimals recorded as 0.0
    return {"seconds": round(sum(float(seconds.get(s, 0.0)) for s in CHECK_STAGES), 4),
            "peak_mib": round(max(peaks.values()), 1), "added_mib": round(added, 1)}


def checks_line(record: Any) -> str | None:
    """The CLI's line for ``parity.checks`` (None where the manifest has none that reads)."""
    if not isinstance(record, dict) or not all(type(record.get(k)) in (int, float)
                                               for k in ("seconds", "peak_mib", "added_mib")):
        return None
    return (f"checks: {record['seconds']:.1f} s (parity sets, eager reference, onnxruntime runs); they raised the "
            f"peak RSS by {record['added_mib']:.0f} MiB, to {record['peak_mib']:.0f} MiB")
