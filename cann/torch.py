"""``cann.torch``: the adapter surface users know from the seeds, over ``cann_export``'s API.

One function per verb of the articles; each delegates to a ``cann_export`` module (backends, tracking,
checkpoints, the profiler, the export API), so adding a verb (or a setting ``config`` reads) stays local.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cann_export.backend import profiler
from cann_export.inputs import tracking

__all__ = ["config", "device", "device_count", "disable", "enable", "export", "is_available", "prepare",
           "profiler", "resume", "set_device", "track"]

_CONFIG_KEYS = ("mixed_precision", "gradient_checkpointing", "dataloader_workers", "compile_model",
                "quantization_aware_training", "quant_config")
_config: dict[str, Any] = {"quantization_aware_training": False, "quant_config": {}}
_backend: str | None = None


def export(model: Any = None, output_path: str | Path | None = None, export_format: str = "atc_ready",
           include_optimizer_state: bool = False, optimizer: Any = None, metadata: dict[str, Any] | None = None,
           atc_hints: dict[str, Any] | None = None, example_inputs: Any = None, **options: Any) -> Any:
    """Export ``model`` as in ``cann_export.export``; without ``example_inputs`` the inputs of the
    model's last forward call are used when they were recorded (``track(model)`` or ``enable()``). The
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
    _check_qat_applied(model)
    from cann_export.qat import auto

    with auto.suspended():
        return api.export(model, output_path, export_format, example_inputs,
                          include_optimizer_state=include_optimizer_state, optimizer=optimizer,
                          metadata=dict(metadata or {}), atc_hints=dict(atc_hints or {}), **options)


def _check_qat_applied(model: Any) -> None:
    """QAT configured but never applied would silently export a float model: refuse with what to do."""
    from cann_export.errors import OptionsError
    from cann_export.qat import qat_state

    if not _config["quantization_aware_training"] or not hasattr(model, "named_modules"):
        return
    if qat_state(model) is None and not _ao_quantized(model):
        raise OptionsError(
            "cann.torch.config(quantization_aware_training=True) is set, but this model was never trained after "
            "it: fake quantization goes in at the model's first forward call in train mode. Run the training "
            "loop after config(...), or call cann.torch.prepare(model) before training; to export in float, "
            "call cann.torch.config(quantization_aware_training=False) first")


def _ao_quantized(model: Any) -> bool:
    """A model prepared with PyTorch's own QAT API (FakeQuantize modules) counts as quantized."""
    from torch.ao.quantization import FakeQuantizeBase

    return any(isinstance(m, FakeQuantizeBase) for m in model.modules())


def track(model: Any) -> Any:
    """Record ``model``'s forward inputs so ``export`` can reuse the most recent ones."""
    return tracking.track(model)


def enable(backend: str = "auto") -> str:
    """Make ``npu`` usable in this process, then record the inputs of every outermost module call (for
    ``export``). ``auto``: the real Ascend device when torch_npu imports and reports one, else npu-sim
    (an emulated ``npu`` computing on the CPU). On npu / npu-sim, ``"cann"`` becomes a name of the
    device (``model.to("cann")``, ``device="cann:0"``). Returns the backend's name. Never runs on import."""
    from cann_export.backend import device_alias
    from cann_export.backend.registry import resolve

    global _backend
    chosen = resolve(backend)
    chosen.activate()
    _backend = chosen.name
    if chosen.device == "npu":
        device_alias.install()
        _complete_torch_npu()
    tracking.enable_global()
    return chosen.name


def _complete_torch_npu() -> None:
    """On a real torch_npu: ``torch.npu.enable_graph_mode`` (torch_npu 1.x's name) when it has none."""
    import torch

    module = getattr(torch, "npu", None)
    if module is not None and not hasattr(module, "enable_graph_mode"):
        from cann_export.backend.graph_mode import enable_graph_mode

        module.enable_graph_mode = enable_graph_mode


def disable() -> None:
    """Undo ``enable()``: input recording, the ``cann`` device name, graph mode and npu-sim's operator
    registrations (torch cannot rename PrivateUse1 back: ``npu`` stays the device's name, unusable)."""
    from cann_export.backend import device_alias, graph_mode
    from cann_export.backend.npu_sim import uninstall

    global _backend
    tracking.disable_global()
    device_alias.uninstall()
    graph_mode.enable_graph_mode(False)
    uninstall()
    _backend = None


def device(spec: Any = "cann") -> Any:
    """``torch.device`` for ``"cann"``, ``"cann:0"``, ``"npu:0"``, ``0`` (torch's own parser knows ``npu``)."""
    from cann_export.backend.device_alias import device as as_device

    return as_device(spec)


def set_device(device: Any = "npu:0") -> None:
    """Choose the device, as in the seeds: ``"npu:0"`` (also ``"cann:0"``), ``"npu-sim"``, ``"cpu"``."""
    import torch

    name = str(device)
    if name.startswith("cann"):
        name = "npu" + name[4:]
    if name.startswith("npu") and name != "npu-sim":
        if _backend is None:
            enable()
        getattr(torch, "npu").set_device(torch.device(name))
    else:
        enable(name)


def device_count() -> int:
    """Number of npu devices (1 under npu-sim; 0 before ``enable()`` when there is no real NPU)."""
    import torch

    module = getattr(torch, "npu", None)
    return int(module.device_count()) if module is not None else 0


def is_available() -> bool:
    import torch

    module = getattr(torch, "npu", None)
    return bool(module is not None and module.is_available())


def resume(path: str | Path, model: Any = None, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved on npu, npu-sim, cuda or cpu into ``model``/``optimizer`` on their current
    device; returns the rest of the checkpoint (epoch, step, ...). ``resume(path)`` alone restores the
    tracked model (moved with ``.to("cann")`` after ``enable()``, or ``track``-ed) and its optimizer."""
    from cann_export.backend.checkpoint import resume as _resume

    return _resume(path, model, optimizer)


def config(**settings: Any) -> dict[str, Any]:
    """Library-wide settings, as in the seeds: ``config(quantization_aware_training=True,
    quant_config={"weight_bits": 8, "activation_bits": 8})``. Returns the current settings."""
    from cann_export.errors import OptionsError
    from cann_export.qat.config import parse

    unknown = sorted(set(settings) - set(_CONFIG_KEYS))
    if unknown:
        raise OptionsError(f"unknown cann.torch.config key(s) {', '.join(unknown)}; known keys: {', '.join(_CONFIG_KEYS)}")
    from cann_export.qat import settings as training

    if "quant_config" in settings:
        settings["quant_config"] = parse(settings["quant_config"]).to_dict()
    if "quantization_aware_training" in settings and not isinstance(settings["quantization_aware_training"], bool):
        raise OptionsError("quantization_aware_training must be True or False")
    chosen = training.parse({k: v for k, v in settings.items() if k in training.KEYS}, training.current())
    training.set_current(chosen)  # the library's QAT fine-tuning and calibration loops follow these
    _config.update({k: v for k, v in settings.items() if k not in training.KEYS})
    from cann_export.qat import auto

    if _config["quantization_aware_training"]:  # the user's own loop becomes a QAT loop (see qat/auto.py)
        auto.install(_config["quant_config"])
    else:
        auto.uninstall()
    return {**_config, **chosen.to_dict()}


def prepare(model: Any, example_inputs: Any = None) -> Any:
    """Insert fake quantization (BatchNorm folded) as configured with ``config``; returns a new module."""
    from cann_export.errors import OptionsError
    from cann_export.qat import prepare as qat_prepare

    if not _config["quantization_aware_training"]:
        raise OptionsError("cann.torch.prepare needs cann.torch.config(quantization_aware_training=True, ...) first")
    return qat_prepare(model, example_inputs, _config["quant_config"])
