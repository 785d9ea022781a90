"""Parity per shape of a dynamic graph: the fp32 and device-precision verdicts at the example's shape and at
each extra shape (the sizes ATC builds: every gear, or a ~ range's ends and middle: inputs/dynamic_axes.py),
each reported, all needed for the overall verdict. The overall fp32 verdict covers every set; the report's
device run is the example's shape, each other shape's device run is made here, once."""
from __future__ import annotations

from typing import Any


def groups(labels: list[dict[str, Any]] | None) -> list[tuple[dict[str, int] | None, list[int]]]:
    """(shape, verdict set indices): the example's shape first, then each extra shape in order."""
    out: dict[str, tuple[dict[str, int] | None, list[int]]] = {}
    for s, label in enumerate(labels or []):
        if label.get("role") == "probe":
            continue
        shape = label.get("shape")
        key = repr(sorted(shape.items())) if shape else ""
        out.setdefault(key, (shape, []))[1].append(s)
    return list(out.values()) if len(out) > 1 else []


def add_shape_verdicts(report: dict[str, Any], labels: list[dict[str, Any]] | None, device: Any = None,
                       example_device: bool | None = None) -> None:
    """``report["shapes"]``: per shape, its fp32 verdict (no failing verdict set of that shape) and, with
    ``device`` (indices -> passed), its device verdict; the example's shape's is ``example_device`` (the
    report's own device run, on those sets only)."""
    found = groups(labels)
    if not found or "outputs" not in report:
        return
    failing = {f["set"] for f in report.get("failing_sets") or [] if f.get("role") != "probe"}
    graph = report.get("graph_fp32") or report
    fp32_all = bool(graph.get("passed", report.get("passed")))
    rows = []
    from ..progress import counted

    for shape, sets in counted(found, "shapes (gears, range points)"):
        fp32 = not (failing & set(sets)) and (fp32_all or bool(failing))
        row: dict[str, Any] = {"shape": shape, "input_sets": sets,
                               "fp32": bool(fp32)}
        if device is not None and report.get("device") is not None:
            first = shape == (labels[0].get("shape") if labels else None)
            row["device"] = bool(example_device) if first and example_device is not None else bool(device(sets))
        row["passed"] = row["fp32"] and row.get("device", True)
        rows.append(row)
    report["shapes"] = rows
    report["passed"] = bool(report.get("passed")) and all(r["passed"] for r in rows)


def device_check(model: Any, mode: str, keep: list[str], feeds: list, expected: list, names: list[str],
                 tolerance: Any, paths: dict[str, str], overflow: str, deq_scale: str, lists: Any = None) -> Any:
    """indices -> the device verdict on those sets alone (one emulator for every shape)."""
    from ..heap_release import give_back
    from .device_parity_run import device_report
    from .emulators import emulator_for

    emulator = emulator_for(model, mode, overflow, deq_scale, lists)

    def check(sets: list[int]) -> bool:
        report = device_report(model, mode, keep, [feeds[s] for s in sets], [expected[s] for s in sets], names,
                               tolerance.device_policy(), paths, emulator=emulator, localise_failure=False,
                               overflow=overflow, deq_scale=deq_scale)
        give_back()  # one shape's emulated run freed before the next shape's
        return bool(report["passed"])

    return check
