"""Cross-hardware resume: a checkpoint saved on npu, npu-sim, cuda or cpu, loaded onto the current device."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..safe_text import terminal

_log = logging.getLogger("cann_export.resume")


def _device_of(model: Any) -> Any:
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def resume(path: str | Path, model: Any = None, optimizer: Any = None) -> dict[str, Any]:
    """Load ``{"model": ..., "optimizer": ..., "epoch": ..., "step": ...}`` (or a bare state_dict) from
    ``path`` into ``model``/``optimizer`` on the model's current device; return the training state.

    Without ``model``: the tracked model (``cann.torch.track``, moved with ``.to("cann")``/``.npu()`` or
    called after ``cann.torch.enable()``), and its optimizer when exactly one live optimizer updates it.

    A checkpoint saved during QAT (auto-QAT wraps the layers at the first train-mode forward) wraps the
    model's layers the same way first (qat/restore.py). The returned dict's ``"restored"`` lists what was
    loaded: ``"model"``, ``"optimizer"``, ``"qat_observers"``; the same goes to the log."""
    import torch

    if model is None:
        from ..errors import OptionsError
        from ..inputs.tracking import sole_optimizer, tracked_model

        model = tracked_model()
        if model is None:
            raise OptionsError(f"resume({str(path)!r}): no tracked model; pass resume(path, model, optimizer), "
                               "or call cann.torch.enable() before model.to('cann') (or cann.torch.track(model))")
        if optimizer is None:
            optimizer = sole_optimizer(model, f"resume({str(path)!r}) of the tracked model")
            optimizer_was_found = True
        else:
            optimizer_was_found = False
    else:
        optimizer_was_found = False

    ckpt = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path}: not a checkpoint dict")
    state = ckpt.get("model", ckpt.get("state_dict", ckpt))
    if not isinstance(state, dict):
        raise ValueError(f"{path}: no model state_dict in the checkpoint")
    from ..qat.restore import align

    aligned, observers = align(model, state, f"resume({str(path)!r})")
    model.load_state_dict(aligned)  # copies into the parameters, wherever they live
    restored = ["model", *(["qat_observers"] if observers else [])]
    if optimizer is not None and optimizer_was_found and "optimizer" not in ckpt:
        optimizer = None  # found by resume(path), and the checkpoint holds no optimizer state: nothing to load
    if optimizer is not None:
        if "optimizer" not in ckpt:
            raise ValueError(f"{path}: an optimizer was given but the checkpoint holds no optimizer state")
        # the wrapped layers keep their Parameter objects (qat/wrapping.py), so the saved parameter order
        # is the optimizer's before and after QAT went in
        optimizer.load_state_dict(ckpt["optimizer"])  # the optimizer casts its state to its params' device
        restored.insert(1, "optimizer")
    rest = {} if state is ckpt else {k: v for k, v in ckpt.items() if k not in ("model", "state_dict", "optimizer")}
    _log.info("cann.torch.resume(%s): restored %s%s", terminal(path), ", ".join(restored),
              "".join(f", {k}={v}" for k, v in rest.items() if k in ("epoch", "step")))
    return {**rest, "restored": restored}
