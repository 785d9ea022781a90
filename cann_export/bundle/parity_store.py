"""The parity data a bundle keeps so ``cann-export validate`` can re-run parity without the model: the input sets
and their reference outputs (parity/inputs.safetensors, parity/expected.safetensors).

A decoder's reference logits at its range ends are most of a bundle (GPT-2's prefill: 455 MB of logits beside
500 MB of weights), so what is stored is capped (``ExportOptions.stored_parity_mib``): every set at the example's
shape (the device verdict's sets) and at every shape that failed is kept; the other shapes are kept whole, the
smallest first, while they fit. The manifest's ``parity.stored`` names the shapes left out, so ``validate``
re-derives the rest and says what it could not re-run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from ..context import ExportContext


def _own(arr: Any) -> Any:
    """``arr`` as torch can share it: a writable C-contiguous array as is (no second copy of a vocabulary's logits
    at every parity shape), else a copy (a read-only map of a spilled output)."""
    import numpy as np

    arr = np.asarray(arr)
    return arr if arr.flags.writeable and arr.flags.c_contiguous else arr.copy()


def _set_bytes(ctx: ExportContext, s: int) -> int:
    import numpy as np

    floats = ctx.float_reference_outputs[s] if len(ctx.float_reference_outputs) == len(ctx.input_sets) else []
    return (sum(t.numel() * t.element_size() for t in ctx.input_sets[s].values())
            + sum(np.asarray(a).nbytes for a in [*ctx.reference_outputs[s], *floats]))


def chosen_sets(ctx: ExportContext, cap_bytes: int | None) -> tuple[list[int], list[dict[str, Any]]]:
    """The input sets to store (indices, in order) and, per shape left out, its shape, sets and bytes.
    Sets are kept per shape (all of a shape or none), so a stored shape's verdict re-derives as recorded."""
    labels, count = ctx.input_set_labels, len(ctx.input_sets)
    parity = ctx.reports.parity
    if cap_bytes is None or parity is None or len(labels) != count or not count or "shape" not in labels[0]:
        return list(range(count)), []
    groups: dict[str, list[int]] = {}
    for s, label in enumerate(labels):
        groups.setdefault(json.dumps(label.get("shape"), sort_keys=True), []).append(s)
    failed = {f.get("set") for f in parity.failing_sets or []}
    failed |= {s for r in parity.shapes or [] if not r.get("passed", True) for s in r.get("input_sets") or []}
    size = {key: sum(_set_bytes(ctx, s) for s in sets) for key, sets in groups.items()}
    must = {key for key, sets in groups.items() if 0 in sets or failed & set(sets)}
    kept, total, left_out = set(must), 0, []  # the cap is for the shapes beyond those that must be kept
    for key in sorted(set(groups) - must, key=lambda k: (size[k], k)):
        if total + size[key] <= cap_bytes:
            kept.add(key)
            total += size[key]
        else:
            left_out.append({"shape": json.loads(key), "input_sets": groups[key], "bytes": size[key]})
    return sorted(s for key in kept for s in groups[key]), sorted(left_out, key=lambda g: g["input_sets"][0])


def write_parity_data(ctx: ExportContext, directory: Path) -> list[Path]:
    """The export's parity inputs and reference outputs, as ``directory``/inputs.safetensors and
    expected.safetensors. Call it from a format's ``finalize`` (after validate, so the sets that failed are known
    and kept) when ``ctx.options.validate and ctx.input_sets``; it records what it stored in ``ctx.reports.parity``
    (``stored``). Called before validate, it stores every set."""
    import torch
    from safetensors.torch import save_file

    from ..inputs.float_noise import measured

    mib = ctx.options.stored_parity_mib
    sets, left_out = chosen_sets(ctx, None if mib is None else mib << 20)
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
               "noise": measured(ctx),  # the reference's own float noise (the fp32 floor), measured now if deferred
               "int8_noise": ctx.int8_noise}  # the fake-quant reference's own rounding noise (int8 floor)
    for key, values in per_set.items():
        if len(values) == len(ctx.input_sets):
            order[key] = json.dumps([values[s] for s in sets])
    save_file(inputs, str(directory / "inputs.safetensors"), metadata=order)
    save_file(expected, str(directory / "expected.safetensors"), metadata=order)
    if ctx.reports.parity is not None and left_out:
        ctx.reports.parity.stored = {"input_sets": sets, "of": len(ctx.input_sets), "cap_mib": mib,
                                     "left_out": left_out}
    return [directory / "inputs.safetensors", directory / "expected.safetensors"]


def left_out_shapes(recorded: dict[str, Any], sets_read: Any, path: Any) -> list[Any] | None:
    """The shapes manifest.json's ``parity.stored`` says the parity data leaves out, or None when it stores
    every set. ``sets_read``: how many sets the parity data holds (as many as the manifest says)."""
    stored = recorded.get("stored")
    if stored is None:
        return None
    sets = stored.get("input_sets") if isinstance(stored, dict) else None
    left = stored.get("left_out") if isinstance(stored, dict) else None
    if not (isinstance(sets, list) and isinstance(left, list) and len(left) <= 4096
            and all(isinstance(g, dict) and isinstance(g.get("shape"), dict) for g in left)):
        raise errors.ValidateError("manifest.json's parity.stored is malformed (it lists the input sets the parity "
                                   "data holds and the shapes it leaves out); export the bundle again", path=path)
    if len(sets) != sets_read:
        raise errors.ValidateError(f"the parity data holds {sets_read} input sets, manifest.json's "
                                   f"parity.stored lists {len(sets)}; the bundle was changed after export", path=path)
    return [g["shape"] for g in left]
