"""Dynamic loss scaling for ``mixed_precision="fp16"`` in the user's unchanged loop
(``loss.backward(); optimizer.step()``), with torch's own AMP kernels and GradScaler's defaults.

There is no ``scaler.scale(loss)`` in such a loop, so the scale goes in at the tracked model's outputs: an
identity whose backward multiplies the incoming gradient by the scale, so every gradient inside the fp16
forward is scaled (the loss's own backward, outside the model, runs in fp32). Each parameter's gradient
is unscaled as it arrives (a tensor hook, ``torch._amp_foreach_non_finite_check_and_unscale_``), so
``p.grad`` always holds the true gradient: gradient clipping and accumulation in the loop work as without
AMP. At ``optimizer.step()`` (a global step pre-hook) an inf/nan seen since the last step skips the step
for the model's parameters (their gradients set to None, which torch's optimizers skip) and halves the
scale; 2000 clean steps double it (``torch._amp_update_scale_``).

Limit: a gradient reaching a parameter from outside the tracked forward (a regularizer on
``model.parameters()`` added to the loss) is divided by the scale too.
"""
from __future__ import annotations

import weakref
from typing import Any

INIT_SCALE, GROWTH, BACKOFF, INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000
_scalers: weakref.WeakKeyDictionary[Any, LossScale] = weakref.WeakKeyDictionary()
_hook: dict[str, Any] = {}


class _ScaleGrad:
    """Built lazily (torch imported on first use): ``apply(x, scale)`` is x forward, grad * scale backward."""

    fn: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls.fn is None:
            import torch

            class ScaleGrad(torch.autograd.Function):
                @staticmethod
                def forward(ctx: Any, x: Any, scale: Any) -> Any:
                    ctx.save_for_backward(scale)
                    return x.view_as(x)

                @staticmethod
                def backward(ctx: Any, grad: Any) -> Any:
                    (scale,) = ctx.saved_tensors
                    return grad * scale.to(grad.dtype), None

            cls.fn = ScaleGrad
        return cls.fn


class LossScale:
    """One model's scale, growth tracker and found-inf flag, on the device of its parameters."""

    def __init__(self, model: Any) -> None:
        import torch

        device = next(iter(model.parameters())).device
        self.scale = torch.full((), INIT_SCALE, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ids = {id(p) for p in self.params}
        self.stepped = False  # an optimizer stepped since the last backward: the next backward starts afresh
        self.skip = False  # the last update found an inf/nan
        self.steps = self.skipped = 0
        self.handles = [p.register_hook(self._unscale) for p in self.params]

    def scale_outputs(self, out: Any) -> Any:
        """The model's outputs, with gradients flowing back through them multiplied by the scale."""
        import torch
        from torch.utils import _pytree as pytree

        fn = _ScaleGrad.get()

        def one(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.requires_grad:
                return fn.apply(x, self.scale.to(x.device))
            return x

        if isinstance(out, torch.Tensor):
            return one(out)
        if isinstance(out, dict):  # transformers' ModelOutput too: its items set in place
            for k in list(out.keys()):
                out[k] = pytree.tree_map(one, out[k])
            return out
        return pytree.tree_map(one, out)

    def _unscale(self, grad: Any) -> Any:
        import torch

        if self.scale.device != grad.device:  # the model moved (track() on the CPU, then .to("cann"))
            self.scale, self.growth_tracker, self.found_inf = (
                t.to(grad.device) for t in (self.scale, self.growth_tracker, self.found_inf))
        if self.stepped:
            self.found_inf.zero_()
            self.stepped = False
        grad = grad.clone()
        inv = self.scale.double().reciprocal().float().to(grad.device)
        torch._amp_foreach_non_finite_check_and_unscale_([grad], self.found_inf, inv)
        return grad

    def before_step(self, optimizer: Any) -> None:
        import torch

        mine = [p for group in optimizer.param_groups for p in group["params"] if id(p) in self.ids]
        if not mine:
            return
        if not self.stepped:  # the first optimizer to step after a backward updates the scale
            self.skip = bool(self.found_inf.item())
            torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf, GROWTH, BACKOFF, INTERVAL)
            self.stepped = True
            self.steps += 1
            self.skipped += int(self.skip)
        if self.skip:
            for p in mine:
                p.grad = None  # torch's optimizers skip parameters without a gradient

    def state(self) -> dict[str, Any]:
        return {"scale": float(self.scale), "steps": self.steps, "skipped_steps": self.skipped}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _before_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
    for scaler in list(_scalers.values()):
        scaler.before_step(optimizer)


def attach(model: Any) -> LossScale:
    """Scale ``model``'s fp16 gradients from now on; returns its scaler (one per model)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    if model not in _scalers:
        _scalers[model] = LossScale(model)
    if "step" not in _hook:
        _hook["step"] = register_optimizer_step_pre_hook(_before_step)
    return _scalers[model]


def detach(model: Any) -> None:
    scaler = _scalers.pop(model, None)
    if scaler is not None:
        scaler.remove()
    if not _scalers and "step" in _hook:
        _hook.pop("step").remove()


def of(model: Any) -> LossScale | None:
    return _scalers.get(model)
