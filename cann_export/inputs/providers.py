"""The built-in example-input providers of the prepare stage, tried in descending priority: what the caller
gave (``example_inputs=``, ``--example-inputs``, ``--input-shape``), what the model file holds, the first
calibration sample, the last recorded forward call, and a shape inferred from the first layer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import errors
from ..context import ExportContext
from ..load.tensor_files import read_example_inputs
from . import tensors


def accepted_names(ctx: ExportContext) -> list[str]:
    """The inputs the model takes, in order: the graph's for a program, else forward's parameters."""
    return ctx.loaded.extras.get("input_names") or tensors.forward_input_names(ctx.model)


@dataclass(frozen=True)
class ExplicitInputs:
    """``export(example_inputs=...)``: a tensor, a tuple of them, a dict name -> tensor or a safetensors path."""

    name: str = "example_inputs"
    priority: int = 100

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        if ctx.explicit_inputs is None:
            return None
        return as_named(ctx.explicit_inputs, accepted_names(ctx)), "example_inputs"


@dataclass(frozen=True)
class ExampleInputsFile:
    """``--example-inputs FILE.safetensors``."""

    name: str = "example_inputs_file"
    priority: int = 90

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        path = ctx.options.example_inputs_file
        return (read_example_inputs(path), str(path)) if path else None


@dataclass(frozen=True)
class InputShapes:
    """``--input-shape NAME:D1,D2,...[:DTYPE]``: seeded tensors; a missing dtype is the model's (inputs.signature)."""

    name: str = "input_shapes"
    priority: int = 80

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        specs = ctx.options.input_shapes
        return (tensors.tensors_from_specs(specs, ctx.model, ctx.options.seed), "--input-shape") if specs else None


@dataclass(frozen=True)
class ArchiveInputs:
    """The example inputs stored in the model file (a torch.export archive's)."""

    name: str = "archive"
    priority: int = 70

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        stored = ctx.loaded.example_inputs
        return (dict(stored), "the archive's example inputs") if stored else None


@dataclass(frozen=True)
class CalibrationSample:
    """The first sample of ``--calibration-data``."""

    name: str = "calibration_data"
    priority: int = 60

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        path = ctx.options.calibration_data
        if not path:
            return None
        from ..qat.calibration import read_calibration

        feed = {k: v[:1] for k, v in read_calibration(path, accepted_names(ctx)).items()}
        return feed, f"the first sample of {path}"


@dataclass(frozen=True)
class RecordedCall:
    """The last forward call of an in-memory model (``cann.torch.track(model)``, inputs.tracking)."""

    name: str = "recorded_call"
    priority: int = 50

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        from .recorded import choose_call
        from .tracking import recorded_inputs

        if isinstance(ctx.source, (str, Path)) or recorded_inputs(ctx.source) is None:
            return None
        accepted = accepted_names(ctx)
        (args, kwargs), source = choose_call(ctx, accepted)
        return {**as_named(tuple(args), accepted), **kwargs}, source


@dataclass(frozen=True)
class FirstLayer:
    """A model (a file, or a module given to the Python API) without inputs: one input shaped for its first
    Conv / Linear / Embedding, when the model runs on it (recorded as a warning, inputs.shape_inference)."""

    name: str = "first_layer"
    priority: int = 10

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None:
        from .shape_inference import infer_example_input

        inferred = infer_example_input(ctx.model, accepted_names(ctx), ctx.options.seed)
        if inferred is not None:
            ctx.reports.warnings.inputs = inferred[1]
        return inferred


BUILTIN = (ExplicitInputs(), ExampleInputsFile(), InputShapes(), ArchiveInputs(), CalibrationSample(),
           RecordedCall(), FirstLayer())


def as_named(value: Any, accepted: list[str]) -> dict[str, Any]:
    """``example_inputs`` as {name: tensor}: positional values take forward's parameter names in order."""
    import torch

    if isinstance(value, (str, Path)):
        return read_example_inputs(value, "example_inputs")
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, torch.Tensor):
        value = (value,)
    if isinstance(value, (tuple, list)):
        if len(value) > len(accepted):
            raise errors.PrepareError(f"{len(value)} example inputs given, but forward takes {len(accepted)} "
                                      f"({', '.join(accepted)})")
        return dict(zip(accepted, value, strict=False))
    raise errors.PrepareError(f"example_inputs must be a tensor, a tuple of tensors or a dict name -> tensor, "
                              f"not {type(value).__name__}")
