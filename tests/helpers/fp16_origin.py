"""Ground truth for the origin of an fp16 divergence, from real fp16 in torch: the first leaf module, in
execution order, whose output under ``model.half()`` is non-finite or wrong (cosine < 0.99 against fp32)
while every float input it received is finite and right. Independent of the tool's emulation and graph."""
from __future__ import annotations

import copy

import torch


def _floats(value):
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _floats(v)]
    if hasattr(value, "to_tuple"):
        return _floats(value.to_tuple())
    return []


def _record(model, inputs):
    """``[(module path, float inputs, float outputs)]`` of every leaf module call, in execution order."""
    calls = []
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: calls.append(
        (name, [a.detach().double() for a in _floats(args)], [o.detach().double() for o in _floats(out)])))
        for name, m in model.named_modules() if name and not list(m.children())]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    return calls


def _right(got, want) -> bool:
    if got.shape != want.shape:
        return False
    finite = torch.isfinite(want)
    if not torch.isfinite(got[finite]).all():
        return False
    g, w = got[finite].flatten(), want[finite].flatten()
    if g.numel() == 0 or (g.norm() == 0 and w.norm() == 0):
        return True
    return float(torch.nn.functional.cosine_similarity(g, w, dim=0)) >= 0.99


def first_wrong_module(model, inputs) -> str | None:
    """The module real fp16 breaks in first (None when every module's fp16 output is right)."""
    reference = _record(model, inputs)
    half_in = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    half = _record(copy.deepcopy(model).half(), half_in)
    for (name, ref_in, ref_out), (_, got_in, got_out) in zip(reference, half, strict=False):
        inputs_right = all(_right(g, r) for g, r in zip(got_in, ref_in, strict=False))
        if inputs_right and not all(_right(g, r) for g, r in zip(got_out, ref_out, strict=False)):
            return name
    return None
