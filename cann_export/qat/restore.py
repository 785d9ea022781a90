"""A QAT training checkpoint loaded into a model in another state of wrapping, as after a restart.

Auto-QAT (qat/auto.py) wraps the layers at the first train-mode forward, so a checkpoint saved after it
holds ``<layer>.layer.weight`` and the observers ``<layer>.act_min``/``act_max``, while the model of a new
process is not wrapped yet (and the reverse for a checkpoint saved before it). ``align`` wraps the model's
layers the checkpoint holds wrapped (same Parameter objects: the optimizer's param mapping is unchanged),
or maps a plain checkpoint onto an already wrapped model with fresh observers, as they were at save time.
"""
from __future__ import annotations

from typing import Any

OBSERVERS = ("act_min", "act_max")


def wrapped_paths(state: dict[str, Any]) -> list[str]:
    """The layer paths a state_dict holds fake-quantized (observers next to a wrapped ``layer``)."""
    paths = []
    for key in state:
        if key.endswith(".act_min") or key == "act_min":
            path = key[: -len("act_min")].rstrip(".")
            prefix = f"{path}." if path else ""
            if f"{prefix}act_max" in state and f"{prefix}layer.weight" in state:
                paths.append(path)
    return paths


def align(model: Any, state: dict[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    """``state`` made loadable into ``model`` (wrapping ``model`` in place when the checkpoint was saved
    after QAT went in); returns it and whether it carries QAT observers."""
    from ..errors import OptionsError
    from .fake_quant import quant_layers
    from .library_config import SESSION
    from .wrapping import wrap_paths

    saved = wrapped_paths(state)
    present = quant_layers(model)
    if saved and not present:
        if not SESSION.quantization_aware_training:
            raise OptionsError(
                f"{where}: the checkpoint was saved during quantization-aware training ({len(saved)} fake-quantized "
                "layer(s)); call cann.torch.config(quantization_aware_training=True, quant_config=...) as in the "
                "run that saved it, before resume")
        try:
            wrap_paths(model, saved, SESSION.quant_config, f"cann.torch.resume: {where}")
        except (AttributeError, ValueError) as e:
            raise OptionsError(f"{where}: the checkpoint's fake-quantized layers do not match this model: {e}") from e
        return state, True
    if present and not saved:  # saved before QAT went in: the wrapped layers as they were, observers fresh
        import torch

        mapped = dict(state)
        for path, layer in present.items():
            prefix = f"{path}." if path else ""
            for name in layer.layer.state_dict():
                if f"{prefix}{name}" in mapped:
                    mapped[f"{prefix}layer.{name}"] = mapped.pop(f"{prefix}{name}")
            mapped[f"{prefix}act_min"] = torch.tensor(float("inf"))
            mapped[f"{prefix}act_max"] = torch.tensor(float("-inf"))
        return mapped, False
    return state, bool(saved)
