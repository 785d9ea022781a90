"""ONNX exporters for the capture stage: torch.onnx's dynamo exporter first, TorchScript as fallback."""
from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import large_model
from ..hookspecs import hookimpl
from ..module_paths import collect, stamp, stamp_from_exporter

_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "torch.fx")


@contextlib.contextmanager
def quiet_export(record: list | None = None) -> Iterator[None]:
    """Keep exporter chatter off stdout (``--json`` owns it) and below warning level; with ``record``,
    the tracer's TracerWarnings are appended to it instead of dropped (trace specialisation)."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            if record is not None:
                import torch

                warnings.simplefilter("always", torch.jit.TracerWarning)
            yield
            if record is not None:
                record.extend(caught)
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def call_args(ctx: Any) -> tuple[tuple, dict]:
    """Modules take named inputs; TorchScript and torch.export graphs take them in order."""
    inputs = ctx.example_inputs
    if ctx.loaded.kind == "module":
        return (), dict(inputs)
    return tuple(inputs[n] for n in ctx.input_names), {}


class DynamoExporter:
    name = "dynamo"
    priority = 100

    def supports(self, model: Any) -> bool:
        import torch

        return isinstance(model, torch.nn.Module) and not isinstance(model, torch.jit.ScriptModule)

    def export(self, model: Any, ctx: Any) -> Any:
        import onnx
        import torch

        args, kwargs = call_args(ctx)
        asked = ctx.options.opset
        native = max(asked, _dynamo_min_opset())
        with quiet_export():
            program = torch.onnx.export(
                model, args, kwargs=kwargs, dynamo=True, opset_version=native,
                input_names=list(ctx.input_names), output_names=list(ctx.output_names),
                verbose=False, report=False, optimize=True,
            )
            graph = large_model.dynamo_graph(program, ctx)  # past the threshold: saved with external data
        stamp_from_exporter(graph)
        if asked < native:  # convert down ourselves (as torch would) so the module paths survive by node name
            origins = collect(graph)
            try:
                converted = onnx.version_converter.convert_version(graph, asked)
                onnx.checker.check_model(converted, full_check=True)  # the converter can write invalid nodes
                graph = converted
            except Exception:  # noqa: BLE001 - torch keeps the native opset too; capture records it
                pass
            stamp(graph, origins)
        return graph


def _dynamo_min_opset() -> int:
    """The lowest opset torch.onnx's dynamo exporter implements (18 in torch 2.13)."""
    try:
        from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET

        return int(TORCHLIB_OPSET)
    except Exception:  # noqa: BLE001 - a private constant: fall back to the value torch 2.13 uses
        return 18


class TorchScriptExporter:
    name = "torchscript"
    priority = 50

    def supports(self, model: Any) -> bool:
        return True

    def export(self, model: Any, ctx: Any) -> Any:
        import torch

        args, kwargs = call_args(ctx)
        if kwargs:  # the tracer binds kwargs by position and turns defaulted parameters into inputs
            model, args = _Positional(model, list(kwargs)), tuple(kwargs.values())
        caught: list = []
        with tempfile.TemporaryDirectory(prefix="cann-export-capture-") as tmp, quiet_export(record=caught):
            path = Path(tmp) / "model.onnx"  # a file path lets torch write external data past 2 GB
            torch.onnx.export(
                model, args, str(path), dynamo=False, opset_version=ctx.options.opset,
                input_names=list(ctx.input_names), output_names=list(ctx.output_names),
                do_constant_folding=True,
            )
            graph = large_model.load_captured(path, ctx)
        stamp_from_exporter(graph, strip_prefix="model" if kwargs else None)  # "model": the _Positional wrapper
        from ..trace_check import tracer_findings

        ctx.trace_warnings = tracer_findings(caught)  # the capture stage marks the graph specialised
        return graph


def _Positional(model: Any, names: list[str]) -> Any:
    """Wrap ``model`` so it takes exactly the named inputs, in order, as positional tensors."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return self.model(**dict(zip(names, tensors)))

    return Positional().train(model.training)  # the exporter restores the wrapper's mode recursively


@hookimpl
def register_exporters(register):
    register(DynamoExporter())
    register(TorchScriptExporter())
