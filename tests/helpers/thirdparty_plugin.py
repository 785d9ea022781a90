"""A third-party plugin written only against cann_export's public contracts: a format headed for an
edge ATC toolchain, an exporter, a validator, a loader, a backend and an ATC hint. Nothing here is
special-cased by the core; the tests check each piece is used exactly as a built-in would be."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cann_export import hookimpl
from cann_export.fs import atomic

EVENTS: list[str] = []  # what the plugin's objects were asked to do, in order


class EdgeBundle:
    """Goes to ATC (so opset range, lint and device parity apply), but only accepts opsets 13..17."""

    name = "edge_bundle"
    description = "model.onnx plus edge.json, for an ATC that parses opset 13..17"
    is_directory = True
    atc_opsets = range(13, 18)
    device_parity = True
    lint = True

    def write(self, ctx: Any, staging: Path) -> list[Path]:
        from cann_export.capture.onnx_utils import save_model

        files = save_model(ctx.onnx_model, staging / "model.onnx", False)
        ctx.onnx_path = files[0]
        EVENTS.append("format.write")
        return files

    def finalize(self, ctx: Any, staging: Path) -> None:
        ctx.manifest = {"format": self.name, "parity_passed": ctx.reports.parity.passed,
                        "device_precision": (ctx.reports.parity.precision or {}).get("mode")}
        atomic.write_text(staging / "edge.json", json.dumps(ctx.manifest))

    def commit(self, ctx: Any, staging: Path) -> list[Path]:
        atomic.commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(ctx.output_path.iterdir())


class PlainTorchScript:
    """An exporter a user picks with --exporter plain-ts (lowest priority: never chosen by auto first)."""

    name = "plain-ts"
    priority = -10

    def supports(self, model: Any) -> bool:
        return True

    def export(self, model: Any, ctx: Any) -> Any:
        import io

        import onnx
        import torch

        EVENTS.append("exporter.export")
        buf = io.BytesIO()
        args = tuple(ctx.example_inputs[n] for n in ctx.input_names)
        torch.onnx.export(model, args, buf, input_names=list(ctx.input_names), opset_version=ctx.options.opset,
                          dynamo=False)
        return onnx.load_from_string(buf.getvalue())


class MaxNodes:
    """A lint-stage validator for every format: graphs beyond ``limit`` nodes fail."""

    name = "max-nodes"
    stage = "lint"
    formats = "*"
    limit = 10_000

    def check(self, ctx: Any) -> dict[str, Any]:
        count = len(ctx.onnx_model.graph.node)
        EVENTS.append("validator.check")
        return {"passed": count <= self.limit, "nodes": count,
                "findings": [] if count <= self.limit else
                [{"severity": "error", "message": f"{count} nodes > {self.limit}"}]}


class WidthFileLoader:
    """``*.mlp`` files hold the hidden width of a small MLP."""

    name = "mlp-width"
    priority = 500

    def matches(self, path: Path) -> bool:
        return path.suffix == ".mlp"

    def load(self, path: Path, options: Any) -> Any:
        from cann_export import LoadedModel
        from helpers.toy_models import make_mlp

        EVENTS.append("loader.load")
        return LoadedModel(make_mlp(hidden=int(path.read_text())), "module")


class TwinCpu:
    """A backend the pipeline's --backend auto prefers over the CPU (priority 1000): it runs on the CPU."""

    name = "cpu-twin"
    device = "cpu"
    description = "the CPU, through a plugin"
    priority = 1000
    auto = True

    def available(self) -> tuple[bool, str]:
        return True, "always"

    def activate(self) -> str:
        EVENTS.append("backend.activate")
        return self.device


class BufferOptimize:
    """ATC's --buffer_optimize option, which the built-in hints do not cover."""

    name = "buffer_optimize"
    advisory = False
    conflicts: tuple[str, ...] = ()
    choices = ("l2_optimize", "off_optimize")

    def normalize(self, value: Any) -> str:
        if value not in self.choices:
            raise ValueError(f"accepted values: {', '.join(self.choices)}")
        return str(value)


@hookimpl
def register_formats(register):
    register(EdgeBundle())


@hookimpl
def register_exporters(register):
    register(PlainTorchScript())


@hookimpl
def register_validators(register):
    register(MaxNodes())


@hookimpl
def register_loaders(register):
    register(WidthFileLoader())


@hookimpl
def register_backends(register):
    register(TwinCpu())


@hookimpl
def register_atc_hints(register):
    register(BufferOptimize())
