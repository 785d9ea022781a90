"""An example input for a module given without any (no --input-shape, no recorded call): read off its first
Conv / Linear / Embedding, and kept only when the model's forward accepts it. The caller says so on stderr
and in the manifest; when nothing fits, the error names the exact flag to pass."""
from __future__ import annotations

from typing import Any

from ..usage.surface import from_cli

# Spatial sizes used for convolutions: 224 px is what image models are built for.
_SPATIAL = {1: (128,), 2: (224, 224), 3: (8, 112, 112)}
_TOKENS = 16


def _first_layer(model: Any) -> tuple[str, Any] | None:
    import torch

    kinds = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear, torch.nn.Embedding)
    for name, module in model.named_modules():
        if isinstance(module, kinds):
            return name, module
    return None


def _candidate(layer: Any, gen: Any) -> tuple[Any, str]:
    import torch

    if isinstance(layer, torch.nn.Embedding):
        shape = (1, _TOKENS)
        return torch.randint(0, layer.num_embeddings, shape, generator=gen), f"{','.join(map(str, shape))}:int64"
    if isinstance(layer, torch.nn.Linear):
        shape = (1, layer.in_features)
    else:
        dims = len(layer.kernel_size)
        shape = (1, layer.in_channels, *_SPATIAL[dims])
    return torch.randn(shape, generator=gen), ",".join(map(str, shape))


def infer_example_input(model: Any, accepted: list[str], seed: int = 0) -> tuple[dict[str, Any], str] | None:
    """({input name: tensor}, a sentence saying what was inferred), or None when no single-input shape
    derived from the first Conv/Linear/Embedding runs through the model."""
    import torch

    if not isinstance(model, torch.nn.Module) or len(accepted) != 1:
        return None
    found = _first_layer(model)
    if found is None:
        return None
    name, layer = found
    tensor, spec = _candidate(layer, torch.Generator().manual_seed(seed))
    try:
        with torch.no_grad():
            model(**{accepted[0]: tensor})
    except Exception:  # noqa: BLE001 - any failure means the guess does not fit this model
        return None
    if from_cli():
        said = (f"an input shape inferred from the first {type(layer).__name__} ({name or 'the model'}): "
                f"--input-shape {accepted[0]}:{spec}; pass --input-shape to choose another")
    else:
        said = (f"an input shape inferred from the first {type(layer).__name__} ({name or 'the model'}): "
                f"input_shapes=[{accepted[0] + ':' + spec!r}]; pass example_inputs= or input_shapes= to choose another")
    return {accepted[0]: tensor}, said


def no_inputs_message(accepted: list[str]) -> str:
    """The refusal when nothing was given and nothing could be inferred: the exact flags (or, through the Python
    API, the arguments) to pass."""
    first = (accepted or ["x"])[0]
    lead = "no example inputs, and no shape could be inferred from the model's first Conv/Linear/Embedding; "
    if not from_cli():
        shapes = ", ".join(repr(f"{n}:D1,D2,...") for n in accepted or ["NAME"])
        return (f"{lead}pass example_inputs=(tensor, ...) (one per forward parameter), or input_shapes=[{shapes}] "
                f"(e.g. input_shapes=[{first + ':1,3,224,224'!r}]), or example_inputs_file='FILE.safetensors', or "
                "call the model once after cann.torch.track(model)")
    flags = " ".join(f"--input-shape {n}:D1,D2,..." for n in accepted) or "--input-shape NAME:D1,D2,..."
    return (f"{lead}pass {flags} (e.g. --input-shape {first}:1,3,224,224) or --example-inputs FILE.safetensors "
            "(example_inputs= in Python, or call the model once after cann.torch.track(model))")
