"""``cann.torch.config``'s training keys applied to the user's own model, for the unchanged loop.

A model is tracked when it is moved to the device after ``cann.torch.enable()`` (``model.to("cann")``,
``.npu()``) or passed to ``cann.torch.track``; the settings apply then, and ``config(...)`` applies changes
to the models already tracked at once (``config(key=False)`` undoes that key). Only the outermost tracked
module gets them (its submodules moved on their own are part of it). What each key does:

- ``mixed_precision`` "fp16"/"bf16": the model's forward runs under ``torch.autocast`` on its parameters'
  device (``npu`` included) and its floating outputs come back in fp32, as accelerate wraps a model's
  forward; parameters stay fp32 (the optimizer updates fp32 master weights). fp16 adds dynamic loss scaling
  (loss_scale.py); bf16 has fp32's range and needs none.
- ``gradient_checkpointing``: recompute.py (transformers' own switch, else the model's repeated blocks).
- ``compile_model``: ``model.compile(backend=...)`` in place, as graph mode does (``True``: aot_eager on
  npu-sim, torchair's backend on an Ascend device when it imports, else torch.compile's default).
- ``dataloader_workers`` cannot reach the user's own DataLoader (see ``workers_note``).

Export sees the plain model: ``lifted(model)`` takes the forward wrappers and the compiled call off while
the CPU copy is made, and puts them back.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import forward_wrap, loss_scale, recompute

_tracked: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclass
class Applied:
    mixed: str | None = None
    recompute: bool = False
    undo_recompute: Any = None
    compiled: str | None = None
    notes: list[str] = field(default_factory=list)


_applied: weakref.WeakKeyDictionary[Any, Applied] = weakref.WeakKeyDictionary()


_current: list[Any] = [None]  # the session's training settings, as its last reconcile_all gave them


def _settings() -> Any:
    if _current[0] is None:  # no session yet: the defaults
        from ..qat.settings import TrainSettings

        return TrainSettings()
    return _current[0]


def _contains(outer: Any, inner: Any) -> bool:
    return outer is not inner and any(m is inner for m in outer.modules())


def on_tracked(model: Any) -> None:
    """``model`` was moved to the device or ``track``-ed: it gets the current settings (unless it is
    inside a tracked model, or one of the library's private copies)."""
    if getattr(model, "_cann_export_private", False) or next(iter(model.parameters()), None) is None:
        return
    roots = list(_tracked)
    if any(_contains(root, model) for root in roots):
        return
    settings = _settings()
    check(model, settings)
    for root in roots:
        if _contains(model, root):  # a part tracked before the whole: the whole takes over
            reconcile(root, None)
            _tracked.discard(root)
    _tracked.add(model)
    reconcile(model, settings)


def check(model: Any, settings: Any) -> None:
    """Refuse what cannot work, before anything changes."""
    import torch

    from ..errors import OptionsError

    if settings.mixed_precision == "fp16":
        half = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
        if half:
            raise OptionsError(
                f"cann.torch.config(mixed_precision='fp16') trains with fp32 master weights, but "
                f"{type(model).__name__} has float16 parameters ({half[0]}, ...): load or build the model in "
                "float32 (drop torch_dtype=torch.float16 / .half()), or call config(mixed_precision=False) to "
                "train it in pure fp16 without loss scaling")


def check_all(settings: Any) -> None:
    for model in list(_tracked):
        check(model, settings)


def reconcile_all(settings: Any) -> None:
    """The session's settings changed (qat/library_config.py): remember them, and bring every tracked model to them."""
    _current[0] = settings
    for model in list(_tracked):
        reconcile(model, settings)


def reconcile(model: Any, settings: Any) -> Applied:
    """Bring ``model`` to ``settings`` (None: the defaults, nothing applied), key by key."""
    state = _applied.setdefault(model, Applied())
    mixed = getattr(settings, "mixed_precision", None)
    if state.mixed != mixed:
        if state.mixed:
            forward_wrap.unwrap(model)
            loss_scale.detach(model)
        if mixed:
            forward_wrap.wrap(model, _amp_forward)
            if mixed == "fp16":
                loss_scale.attach(model)
        state.mixed = mixed
    ckpt = bool(getattr(settings, "gradient_checkpointing", False))
    if state.recompute != ckpt:
        if state.undo_recompute is not None:
            state.undo_recompute()
            state.undo_recompute = None
        if ckpt:
            note, state.undo_recompute = recompute.apply(model)
            state.notes.append(note)
            if state.undo_recompute is None:
                warnings.warn(f"cann.torch.config(gradient_checkpointing=True): {note}", stacklevel=4)
        state.recompute = ckpt
    backend = getattr(settings, "compile_model", None)
    if state.compiled != backend:
        model._compiled_call_impl = None
        if backend:
            model.compile(backend=compile_backend(backend))
        state.compiled = backend
    return state


def compile_backend(name: str) -> Any:
    if name == "auto":
        from .graph_mode import graph_backend

        return graph_backend()
    return name


def _to_fp32(out: Any) -> Any:
    import torch
    from torch.utils import _pytree as pytree

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
            return x.float()
        return x

    if isinstance(out, dict):  # transformers' ModelOutput too: its items set in place
        for k in list(out.keys()):
            out[k] = pytree.tree_map(one, out[k])
        return out
    return pytree.tree_map(one, out)


def _amp_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The tracked model's forward under autocast, outputs in fp32, gradients scaled for fp16."""
    import torch

    run = forward_wrap.inner(self)
    state = _applied.get(self)
    if state is None or not state.mixed or self not in _tracked:  # a copy of the model, not the model
        return run(*args, **kwargs)
    device = next(iter(self.parameters())).device.type
    dtype = torch.float16 if state.mixed == "fp16" else torch.bfloat16
    with torch.autocast(device, dtype=dtype):
        out = run(*args, **kwargs)
    out = _to_fp32(out)
    scaler = loss_scale.of(self)
    if scaler is not None and self.training and torch.is_grad_enabled():
        out = scaler.scale_outputs(out)
    return out


def status(model: Any) -> dict[str, Any]:
    """What is applied to ``model`` now (and the fp16 loss scale's state)."""
    state = _applied.get(model) or Applied()
    scaler = loss_scale.of(model)
    return {"tracked": model in _tracked, "mixed_precision": state.mixed, "gradient_checkpointing":
            state.recompute, "compile_model": state.compiled, "notes": list(state.notes),
            "loss_scale": scaler.state() if scaler is not None else None}


@contextlib.contextmanager
def lifted(model: Any) -> Iterator[None]:
    """``model`` as the user built it while the block runs (export copies it): no forward wrappers, no
    compiled call; everything is put back afterwards."""
    if not hasattr(model, "modules"):
        yield
        return
    wrapped = forward_wrap.wrapped_in(model)
    compiled = [(m, m._compiled_call_impl) for m in model.modules() if m._compiled_call_impl is not None
                and m in _tracked]
    for m, _ in wrapped:
        forward_wrap.unwrap(m)
    for m, _ in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, fn in wrapped:
            forward_wrap.wrap(m, fn)
        for m, impl in compiled:
            m._compiled_call_impl = impl


WORKERS_NOTE = ("cann.torch.config(dataloader_workers={n}) sets the worker processes of cann-export's own "
                "calibration and fine-tuning loaders only; the DataLoader of your training loop is yours and "
                "is not changed. To load your batches in {n} processes, pass them where it is built: "
                "DataLoader(dataset, ..., num_workers={n}) (and persistent_workers=True to keep them between "
                "epochs)")


def workers_note(n: int) -> str:
    return WORKERS_NOTE.format(n=n)
