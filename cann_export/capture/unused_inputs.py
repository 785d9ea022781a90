"""The graph's inputs are the task's inputs: an input the model never reads (RWKV's and MRA's attention_mask) is
dropped by the TorchScript exporter, while the model's callers, its parity sets and the stored torch.export program
all pass it. Such an input is put back into the graph, unused, in the inputs' order, as Optimum's graphs keep it."""
from __future__ import annotations

from typing import Any


def restore_unused_inputs(ctx: Any) -> list[str]:
    """Add to ``ctx.onnx_model`` each of ``ctx.input_names`` the exporter left out (its example's dtype and shape,
    the dynamic axes' dims symbolic); the names added."""
    model = ctx.onnx_model
    if not hasattr(model, "graph"):
        return []
    present = {v.name for v in model.graph.input}
    missing = [n for n in ctx.input_names if n not in present and n in ctx.example_inputs]
    if not missing:
        return []
    from onnx import helper

    axes = {(a.input, a.axis): a.name or f"{a.input}_dim_{a.axis}" for a in ctx.dynamic_axes or []}
    kept = {v.name: v for v in model.graph.input}
    inputs = []
    for name in ctx.input_names:
        if name in kept:
            inputs.append(kept.pop(name))
        elif name in missing:
            t = ctx.example_inputs[name]
            dims = [axes.get((name, k), int(size)) for k, size in enumerate(t.shape)]
            inputs.append(helper.make_tensor_value_info(name, _elem_type(t), dims))
    inputs.extend(kept.values())  # initializers listed as inputs, after the model's own
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return missing


def _elem_type(t: Any) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(t.detach().cpu().numpy().dtype)
