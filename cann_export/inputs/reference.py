"""The PyTorch reference: the model run on every parity input set, on the pipeline's device."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..context import ExportContext
from ..load.calling import call
from .tensors import flatten_outputs


def reference_outputs(ctx: ExportContext, model: Any, source: str, accepted: list[str],
                      input_sets: list[dict[str, Any]] | None = None) -> tuple[list, list]:
    """Run ``model`` on every input set (``ctx.input_sets`` by default): (output names, numpy outputs per set).
    A model past ``external_data_threshold`` keeps each set's outputs on disk, mapped when read (inputs/spill.py)."""
    import torch

    from ..backend.device_choice import pipeline_device, to_device
    from .spill import spill_for

    device = pipeline_device(ctx.options.backend) if ctx.loaded.kind == "module" else "cpu"
    ctx.reports.reference.device = device
    model = to_device(model, device)
    names, outputs, spill = [], [], spill_for(ctx, model)
    with torch.no_grad():
        for one in ctx.input_sets if input_sets is None else input_sets:
            try:
                out = call(model, ctx.loaded.kind, to_device(one, device), ctx.input_names,
                           ctx.loaded.extras.get("keyword_inputs", ()))
            except Exception as e:  # any failure here is the user's file or class
                raise errors.PrepareError(
                    f"the model's forward failed on the inputs from {source}: {type(e).__name__}: "
                    f"{errors.gist(e)}. Check the input names, shapes and dtypes "
                    f"(forward takes {', '.join(accepted) or 'unknown parameters'})",
                    path=ctx.loaded.source_path) from e
            names, tensors = flatten_outputs(out)
            if not tensors:
                raise errors.PrepareError("the model returned no tensors", path=ctx.loaded.source_path)
            arrays = [t.detach().float().cpu().numpy() if t.dtype in (torch.bfloat16,)
                      else t.detach().cpu().numpy() for t in tensors]
            outputs.append(spill.keep(arrays) if spill is not None else arrays)
            del out, tensors, arrays
    to_device(model, "cpu")  # capture and the exporters run on the CPU
    return names, outputs
