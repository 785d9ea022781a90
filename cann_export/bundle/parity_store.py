"""The parity data a bundle keeps so ``cann-export validate`` can re-run parity without the model: the input sets
and their reference outputs (parity/inputs.safetensors, parity/expected.safetensors).

A decoder's reference logits at its range ends are most of a bundle (GPT-2's prefill: 455 MB of logits beside
500 MB of weights), so what is stored is capped (``ExportOptions.stored_parity_mib``). By default (``"auto"``) the
cap follows the graph's own size (its weights on disk, within 2..64 MiB), so a tiny model's bundle stays a few MB:
the example itself (set 0) is always kept and counts against the cap, then the example's other sets (random draws,
probes) one by one, then the other shapes whole, the smallest first, while they fit (each graph of a Whisper-tiny-
sized bundle keeps its example set, 2.7 MB, alone: past the 2 MiB floor). An explicit cap in MiB keeps every set
at the example's shape and applies to the other shapes. A failed export, or one whose reference check would judge
the kept sets otherwise, stores every set. The manifest's ``parity.stored`` names what is left out (a shape whole,
or the example shape's sets marked ``partial``), so ``validate`` re-derives the rest and says what it could not
re-run."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from ..context import ExportContext

_DIM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a dimension name (cann_export.dynamic)


def _own(arr: Any) -> Any:
    """``arr`` as torch can share it: a writable C-contiguous array as is (no second copy of a vocabulary's logits
    at every parity shape), else a copy (a read-only map of a spilled output)."""
    import numpy as np

    arr = np.asarray(arr)
    return arr if arr.flags.writeable and arr.flags.c_contiguous else arr.copy()


def _unshared(tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` with each one whose storage an earlier one already uses copied: safetensors refuses tensors
    that share memory, which outputs of one model can (CLIP's ``logits_per_text`` is the transpose of
    ``logits_per_image``: at batch 1 both are the same [1, 1] buffer)."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _set_bytes(ctx: ExportContext, s: int) -> int:
    import numpy as np

    floats = ctx.float_reference_outputs[s] if len(ctx.float_reference_outputs) == len(ctx.input_sets) else []
    return (sum(t.numel() * t.element_size() for t in ctx.input_sets[s].values())
            + sum(np.asarray(a).nbytes for a in [*ctx.reference_outputs[s], *floats]))


AUTO_FLOOR = 2 << 20  # "auto": the cap follows the graph's size within these bounds
AUTO_CEILING = 64 << 20


def cap_bytes(ctx: ExportContext) -> tuple[int | None, bool]:
    """The stored parity data's cap in bytes (None: every set) and whether the example's shape counts against it
    (the ``"auto"`` default, sized to the written graph, which holds the weights)."""
    mib = ctx.options.stored_parity_mib
    if mib is None:
        return None, False
    if mib != "auto":
        return mib << 20, False
    return min(AUTO_CEILING, max(AUTO_FLOOR, _graph_bytes(ctx))), True


def _graph_bytes(ctx: ExportContext) -> int:
    """Bytes of the written graph and its external data (the model's weights as the bundle holds them)."""
    path = ctx.onnx_path
    if path is None or not path.is_file():
        return 0
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def chosen_sets(ctx: ExportContext, cap: int | None,
                example_counts: bool = False) -> tuple[list[int], list[dict[str, Any]]]:
    """The input sets to store (indices, in order) and what is left out: per shape, its shape, sets and bytes.
    Other shapes are kept whole (all of a shape or none), so a stored shape's verdict re-derives as recorded.
    ``example_counts``: the example's shape counts against ``cap`` too, set by set after the example itself (its
    left-out sets are one entry marked ``partial``: that shape's verdict is re-derived on the sets kept)."""
    labels, count = ctx.input_set_labels, len(ctx.input_sets)
    parity = ctx.reports.parity
    every = list(range(count)), []
    if (cap is None or parity is None or not parity.passed or len(labels) != count or not count
            or "shape" not in labels[0]):
        return every  # a failed verdict keeps all its evidence
    groups: dict[str, list[int]] = {}
    for s, label in enumerate(labels):
        groups.setdefault(json.dumps(label.get("shape"), sort_keys=True), []).append(s)
    size = {key: sum(_set_bytes(ctx, s) for s in sets) for key, sets in groups.items()}
    example = next(key for key, sets in groups.items() if 0 in sets)  # the device verdict's sets
    kept, total, left_out = {0}, _set_bytes(ctx, 0) if example_counts else 0, []  # "auto": the example counts too
    if example_counts:
        dropped = []
        for s in groups[example][1:]:
            one = _set_bytes(ctx, s)
            if total + one <= cap and not dropped:
                kept.add(s)
                total += one
            else:
                dropped.append(s)
        if dropped:
            left_out.append({"shape": json.loads(example), "input_sets": dropped,
                             "bytes": sum(_set_bytes(ctx, s) for s in dropped), "partial": True})
    else:
        kept.update(groups[example])
    for key in sorted(set(groups) - {example}, key=lambda k: (size[k], k)):
        if total + size[key] <= cap:
            kept.update(groups[key])
            total += size[key]
        else:
            left_out.append({"shape": json.loads(key), "input_sets": groups[key], "bytes": size[key]})
    sets = sorted(kept)
    if left_out and _kept_reference_problem(ctx, sets):
        return every
    return sets, sorted(left_out, key=lambda g: g["input_sets"][0])


def _kept_reference_problem(ctx: ExportContext, sets: list[int]) -> bool:
    """Whether parity's reference check (an output constant or non-finite over all the sets) finds a problem on
    the stored ``sets`` (a shape-only output is constant at the example's shape alone); over all of them it found
    none, as the export passed."""
    from ..parity_metrics import reference_problem

    outputs = range(len(ctx.reference_outputs[0])) if ctx.reference_outputs else ()
    return any(reference_problem(ctx.reference_outputs[s][k] for s in sets) for k in outputs)


def write_parity_data(ctx: ExportContext, directory: Path) -> list[Path]:
    """The export's parity inputs and reference outputs, as ``directory``/inputs.safetensors and
    expected.safetensors. Call it from a format's ``finalize`` (after validate, so the sets that failed are known
    and kept) when ``ctx.options.validate and ctx.input_sets``; it records what it stored in ``ctx.reports.parity``
    (``stored``). Called before validate, it stores every set."""
    import torch
    from safetensors.torch import save_file

    from ..inputs.float_noise import stored

    cap, example_counts = cap_bytes(ctx)
    sets, left_out = chosen_sets(ctx, cap, example_counts)
    directory.mkdir()
    inputs, expected = {}, {}
    for new, s in enumerate(sets):
        for name, t in ctx.input_sets[s].items():
            inputs[f"{new}/{name}"] = t.detach().cpu().contiguous()
        for name, arr in zip(ctx.output_names, ctx.reference_outputs[s], strict=False):
            expected[f"{new}/{name}"] = torch.from_numpy(_own(arr))
        if len(ctx.float_reference_outputs) == len(ctx.input_sets):  # a Q/DQ graph's float model (int8 yardstick)
            for name, arr in zip(ctx.output_names, ctx.float_reference_outputs[s], strict=False):
                expected[f"float/{new}/{name}"] = torch.from_numpy(_own(arr))
    order = {"inputs": ",".join(ctx.input_names), "outputs": ",".join(ctx.output_names), "sets": str(len(sets))}
    per_set = {"labels": ctx.input_set_labels,  # which sets decide parity, which are probes
               "noise": stored(ctx),  # the reference's own float noise (the fp32 floor) as the verdict used it
               "int8_noise": ctx.int8_noise}  # the fake-quant reference's own rounding noise (int8 floor)
    for key, values in per_set.items():
        if len(values) == len(ctx.input_sets):
            order[key] = json.dumps([values[s] for s in sets])
    save_file(_unshared(inputs), str(directory / "inputs.safetensors"), metadata=order)
    save_file(_unshared(expected), str(directory / "expected.safetensors"), metadata=order)
    if ctx.reports.parity is not None and left_out:
        ctx.reports.parity.stored = {"input_sets": sets, "of": len(ctx.input_sets), "cap_mib": -(-cap >> 20),
                                     "left_out": left_out}
    return [directory / "inputs.safetensors", directory / "expected.safetensors"]


def left_out_words(left: list[dict[str, Any]], shown: int = 6) -> str:
    """The shapes ``parity.stored`` leaves out, for a person: ``batch=16, batch=2 (its other 4 sets)``."""
    words = [" ".join(f"{k}={v}" for k, v in g["shape"].items())
             + (f" (its other {len(g['input_sets'])} sets)" if g.get("partial") else "") for g in left[:shown]]
    return ", ".join(words) + (f" and {len(left) - shown} more" if len(left) > shown else "")


def left_out_shapes(recorded: dict[str, Any], sets_read: Any, path: Any) -> list[Any] | None:
    """The shapes manifest.json's ``parity.stored`` says the parity data leaves out, or None when it stores
    every set. It must account for every set once, leave out only shapes the manifest records as passed (a
    failed export stores everything), and name as many stored sets as the data holds (``sets_read``)."""
    stored = recorded.get("stored")
    if stored is None:
        return None

    def bad(why: str) -> errors.ValidateError:
        return errors.ValidateError(f"manifest.json's parity.stored {why}; the bundle was changed after export, "
                                    "export it again", path=path)

    if not isinstance(stored, dict) or not _indices(stored.get("input_sets")) or type(stored.get("of")) is not int:
        raise bad("is malformed (it lists the input sets the parity data holds and the shapes it leaves out)")
    left, cap = stored.get("left_out"), stored.get("cap_mib")
    if (not isinstance(left, list) or not 0 < len(left) <= 4096 or type(cap) is not int or cap < 0
            or stored["input_sets"] != sorted(stored["input_sets"])):
        raise bad("is malformed (it lists the input sets the parity data holds and the shapes it leaves out)")
    if not all(isinstance(g, dict) and _dims(g.get("shape")) and _indices(g.get("input_sets"))
               and g.get("partial", False) in (True, False) for g in left):
        raise bad("lists a malformed left-out shape (dimension names and sizes, and its input sets)")
    partial = [g for g in left if g.get("partial")]
    if len(stored["input_sets"]) != sets_read:
        raise bad(f"lists {len(stored['input_sets'])} stored input sets; the parity data holds {sets_read}")
    every = sorted([*stored["input_sets"], *(s for g in left for s in g["input_sets"])])
    if stored["of"] != recorded.get("input_sets") or every != list(range(stored["of"])):
        raise bad(f"does not account once for each of the {recorded.get('input_sets')} input sets parity ran on")
    if partial and (len(partial) > 1 or 0 not in stored["input_sets"]):
        raise bad("leaves out sets of more than the example's shape, or the example itself")
    claimed = {json.dumps(r.get("shape"), sort_keys=True): r for r in recorded.get("shapes") or []
               if isinstance(r, dict)}
    if partial and claimed and 0 not in (claimed.get(json.dumps(partial[0]["shape"], sort_keys=True)) or {}).get(
            "input_sets", []):
        raise bad("marks a shape other than the example's as partly stored")
    rows = [claimed.get(json.dumps(g["shape"], sort_keys=True)) or {} for g in left]
    if recorded.get("passed") is not True or any(
            row.get("passed") is not True or row.get("fp32") is not True or row.get("device", True) is not True
            for row in rows):
        raise bad("leaves out a shape that did not pass (a failed export stores every input set)")
    if any(row.get("input_sets") != g["input_sets"] for row, g in zip(rows, left, strict=True)
           if not g.get("partial")):
        raise bad("gives a left-out shape other input sets than manifest.json's parity.shapes")
    return [g["shape"] for g in left if not g.get("partial")]  # the partly stored example shape is re-derived


def _indices(value: Any) -> bool:
    return (isinstance(value, list) and len(value) <= 1 << 16 and all(type(i) is int and i >= 0 for i in value)
            and len(set(value)) == len(value))


def _dims(shape: Any) -> bool:
    return (isinstance(shape, dict) and 0 < len(shape) <= 64
            and all(isinstance(k, str) and _DIM.fullmatch(k) and type(v) is int and v > 0 for k, v in shape.items()))


def example_row(report: dict[str, Any], quantized: bool) -> None:
    """A re-derived report over the example's shape alone (every other shape left out) gets that shape's row,
    as the export's report has it (a Q/DQ graph's rows: fp32 only), so the rows compare like with like."""
    labels = report.get("sets") or []
    if report.get("shapes") or "outputs" not in report or not labels or not isinstance(labels[0].get("shape"), dict):
        return
    graph = report.get("graph_fp32") or report
    row: dict[str, Any] = {"shape": dict(labels[0]["shape"]), "fp32": bool(graph.get("passed", report.get("passed"))),
                           "input_sets": [s for s, label in enumerate(labels) if label.get("role") != "probe"]}
    if isinstance(report.get("device"), dict) and not quantized:
        row["device"] = bool(report["device"].get("passed"))
    row["passed"] = row["fp32"] and row.get("device", True)
    report["shapes"] = [row]


def as_recorded(report: dict[str, Any], recorded: dict[str, Any]) -> None:
    """The re-derived report in the export's numbering of the input sets, with the manifest's rows for the shapes
    left out (``rederived: false``) in the manifest's order: what --json, JUnit and report.html show."""
    stored = recorded["stored"]
    sets = stored["input_sets"]

    def back(i: Any) -> Any:
        return sets[i] if type(i) is int and 0 <= i < len(sets) else i

    for row in report.get("shapes") or []:
        row["input_sets"] = [back(i) for i in row.get("input_sets") or []]
    for failing in report.get("failing_sets") or []:
        failing["set"] = back(failing.get("set"))
    for label in report.get("sets") or []:
        label["index"] = back(label.get("index"))
    if isinstance(report.get("probes"), dict) and isinstance(report["probes"].get("input_sets"), list):
        report["probes"]["input_sets"] = [back(i) for i in report["probes"]["input_sets"]]
    left = {json.dumps(g["shape"], sort_keys=True) for g in stored["left_out"] if not g.get("partial")}
    derived = {json.dumps(r["shape"], sort_keys=True): r for r in report.get("shapes") or []}
    merged = []
    for row in recorded.get("shapes") or []:
        key = json.dumps(row.get("shape"), sort_keys=True) if isinstance(row, dict) else None
        if key in left:
            merged.append({k: row.get(k) for k in ("shape", "input_sets", "fp32", "device", "passed")
                           if k in row} | {"rederived": False})
        elif key in derived:
            merged.append(derived.pop(key))
    report["shapes"] = merged + list(derived.values())
    report["stored"] = stored
