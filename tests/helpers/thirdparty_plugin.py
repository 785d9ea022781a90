"""A third-party plugin written only against cann_export's public API (names exported from ``cann_export``,
nothing deeper; tests/plugins/test_hooks.py checks the imports): a format headed for an edge ATC toolchain, a
bundle format that validate and inspect read back, an exporter, a validator, a loader, a backend and an ATC
hint. Nothing here is special-cased by the core; the tests check each piece is used exactly as a built-in
would be."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cann_export import (
    CheckedBundle,
    ExportContext,
    ExportOptions,
    LoadedModel,
    ResultInfo,
    commit_dir,
    hookimpl,
    save_model,
    write_atomic,
    write_manifest,
    write_parity_data,
)

EVENTS: list[str] = []  # what the plugin's objects were asked to do, in order


class EdgeBundle:
    """Goes to ATC (so opset range, lint and device parity apply), but only accepts opsets 13..17."""

    name = "edge_bundle"
    description = "model.onnx plus edge.json, for an ATC that parses opset 13..17"
    is_directory = True
    atc_opsets = range(13, 18)
    device_parity = True
    lint = True

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        files = save_model(ctx.onnx_model, staging / "model.onnx")
        ctx.onnx_path = files[0]
        EVENTS.append("format.write")
        return files

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        ctx.manifest = {"format": self.name, "parity_passed": ctx.reports.parity.passed,
                        "device_precision": (ctx.reports.parity.precision or {}).get("mode")}
        write_atomic(staging / "edge.json", json.dumps(ctx.manifest))

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(ctx.output_path.iterdir())


class OpsBundle:
    """A bundle ``validate`` and ``inspect`` read back: model.onnx, ops.txt (the graph's op types in node
    order), parity data and the manifest. It tells them what its artifact holds through the Format's
    optional members; the core knows nothing of ops.txt."""

    name = "ops_bundle"
    description = "directory: model.onnx, ops.txt, parity data and manifest.json"
    is_directory = True
    atc_opsets = None
    device_parity = False
    lint = False

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        files = save_model(ctx.onnx_model, staging / "model.onnx")
        ctx.onnx_path = files[0]
        write_atomic(staging / "ops.txt", "\n".join(n.op_type for n in ctx.onnx_model.graph.node))
        files.append(staging / "ops.txt")
        if ctx.options.validate and ctx.input_sets:
            files += write_parity_data(ctx, staging / "parity")
        EVENTS.append("ops_bundle.write")
        return files

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        write_manifest(ctx, staging)

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(p for p in ctx.output_path.rglob("*") if p.is_file())

    def manifest_problems(self, manifest: dict[str, Any]) -> list[str]:
        return [] if "ops.txt" in manifest["files"] else ["files: ops.txt is not in the file table"]

    def check_artifact(self, checked: CheckedBundle) -> list[str]:
        EVENTS.append("ops_bundle.check_artifact")
        listed = (checked.directory / "ops.txt").read_text().split("\n")
        graph = [n.op_type for n in checked.model.graph.node] if checked.model is not None else None
        return [] if listed == graph else [f"ops.txt: lists {listed}, the graph has {graph}"]

    def describe(self, checked: CheckedBundle) -> dict[str, Any]:
        count = len((checked.directory / "ops.txt").read_text().split("\n"))
        return {"ops_listed": count, "notes": [f"ops.txt lists {count} ops"]}

    def result_info(self, manifest: dict[str, Any], output: Path) -> ResultInfo:
        count = sum(manifest["model"]["ops"].values())
        return ResultInfo({"ops_listed": count}, label="ops bundle", notes=[f"  {output}/ops.txt lists {count} ops"])


class PlainTorchScript:
    """An exporter a user picks with --exporter plain-ts (lowest priority: never chosen by auto first)."""

    name = "plain-ts"
    priority = -10

    def supports(self, model: Any) -> bool:
        return True

    def export(self, model: Any, ctx: ExportContext) -> Any:
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

    def check(self, ctx: ExportContext) -> dict[str, Any]:
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

    def load(self, path: Path, options: ExportOptions) -> LoadedModel:
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
    register(OpsBundle())


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
