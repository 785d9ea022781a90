"""``cann.torch``: the adapter surface users know from the seeds, over ``cann_export``'s API.

One function per verb of the articles; each delegates to a ``cann_export`` module (backends, tracking,
checkpoints, the profiler, the export API), so adding a verb (or a setting ``config`` reads) stays local.
The facade holds no state: ``config``'s settings live in ``cann_export.qat.library_config``, the enabled backend
in ``cann_export.backend.enabled_backend``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cann_export.backend import profiler
from cann_export.backend import enabled_backend as _backend
from cann_export.inputs import tracking
from cann_export.qat.library_config import SESSION as _settings

__all__ = ["config", "device", "device_count", "disable", "enable", "export", "is_available", "prepare",
           "profiler", "resume", "set_device", "track"]


def export(model: Any = None, output_path: str | Path | None = None, export_format: str = "atc_ready",
           include_optimizer_state: bool = False, optimizer: Any = None, metadata: dict[str, Any] | None = None,
           atc_hints: dict[str, Any] | None = None, example_inputs: Any = None, **options: Any) -> Any:
    """Export ``model`` as in ``cann_export.export``; without ``example_inputs`` the inputs of the
    model's recorded calls are used (``track(model)`` or ``enable()``): the last call's, or an earlier call's
    that passed them all and more (an ``attention_mask`` the last call left out); a batch the calls varied
    is dynamic (inputs/recorded.py). The
    model may live on npu, npu-sim or cuda: export works on CPU copies and leaves it where it is."""
    from cann_export import api
    from cann_export.errors import OptionsError

    if model is None or output_path is None:
        raise OptionsError("cann.torch.export needs model= and output_path=")
    if "format" in options:  # the articles' spelling: export(..., format="onnx")
        chosen = options.pop("format")
        if export_format not in ("atc_ready", chosen):
            raise OptionsError(f"cann.torch.export got format={chosen!r} and export_format={export_format!r}; "
                               "pass one of them")
        export_format = chosen
    if include_optimizer_state and optimizer is None:  # the optimizer updating the model, as resume() finds it
        optimizer = tracking.sole_optimizer(model, "cann.torch.export(include_optimizer_state=True)")
        if optimizer is None:
            raise OptionsError("cann.torch.export(include_optimizer_state=True): no live torch.optim optimizer "
                               "updates this model; pass optimizer=<the optimizer>")
    with _settings.exporting(model):
        return api.export(model, output_path, export_format, example_inputs,
                          include_optimizer_state=include_optimizer_state, optimizer=optimizer,
                          metadata=dict(metadata or {}), atc_hints=dict(atc_hints or {}), **options)


def track(model: Any) -> Any:
    """Record ``model``'s forward inputs so ``export`` can reuse the most recent ones."""
    return tracking.track(model)


def enable(backend: str = "auto") -> str:
    """Make ``npu`` usable in this process, then record the inputs of every outermost module call (for
    ``export``). ``auto``: the real Ascend device when torch_npu imports and reports one, else npu-sim
    (an emulated ``npu`` computing on the CPU). On npu / npu-sim, ``"cann"`` becomes a name of the
    device (``model.to("cann")``, ``device="cann:0"``). Returns the backend's name. Never runs on import."""
    return _backend.SESSION.enable(backend)


def disable() -> None:
    """Undo ``enable()``: input recording, the ``cann`` device name, graph mode and npu-sim's operator
    registrations (torch cannot rename PrivateUse1 back: ``npu`` stays the device's name, unusable)."""
    _backend.SESSION.disable()


def device(spec: Any = "cann") -> Any:
    """``torch.device`` for ``"cann"``, ``"cann:0"``, ``"npu:0"``, ``0`` (torch's own parser knows ``npu``)."""
    from cann_export.backend.device_alias import device as as_device

    return as_device(spec)


def set_device(device: Any = "npu:0") -> None:
    """Choose the device, as in the seeds: ``"npu:0"`` (also ``"cann:0"``), ``"npu-sim"``, ``"cpu"``."""
    _backend.SESSION.set_device(device)


def device_count() -> int:
    """Number of npu devices (1 under npu-sim; 0 before ``enable()`` when there is no real NPU)."""
    return _backend.device_count()


def is_available() -> bool:
    return _backend.is_available()


def resume(path: str | Path, model: Any = None, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved on npu, npu-sim, cuda or cpu into ``model``/``optimizer`` on their current
    device; returns the rest of the checkpoint (epoch, step, ...) and ``"restored"``: what was loaded
    (``"model"``, ``"optimizer"``, ``"qat_observers"``). ``resume(path)`` alone restores the tracked model
    (moved with ``.to("cann")`` after ``enable()``, or ``track``-ed) and its optimizer. A checkpoint saved
    during QAT resumes in a new process with QAT configured: its layers are wrapped as they were."""
    from cann_export.backend.checkpoint import resume as _resume

    return _resume(path, model, optimizer)


def config(**settings: Any) -> dict[str, Any]:
    """Library-wide settings, as in the seeds: ``config(quantization_aware_training=True,
    quant_config={"weight_bits": 8, "activation_bits": 8})``. Returns the current settings."""
    return _settings.configure(**settings)


def prepare(model: Any, example_inputs: Any = None) -> Any:
    """Insert fake quantization (BatchNorm folded) as configured with ``config``; returns a new module."""
    return _settings.prepare(model, example_inputs)
