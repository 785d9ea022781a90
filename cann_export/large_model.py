"""Models past ``ExportOptions.external_data_threshold``: the graph lives on disk from capture on.

The exporters write the graph with external data into a work directory beside the output (a staging name,
so a killed run's is swept); the context keeps a slim ModelProto whose initializers point into that file.
No stage builds or serialises a proto holding the weights: capture is checked from the file, onnxsim is
skipped with a note (it needs the model in memory twice), the write stage moves the data file into the
staging directory, and parity runs onnxruntime on the written file.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ALIGN = 4096  # page-aligned tensors let onnxruntime map them instead of copying
_EMBED_LIMIT = 1024  # tensors below this stay inside the proto


@dataclass
class LargeGraph:
    """Where the captured graph's weights are: ``directory / data`` (relative locations in the proto)."""

    workdir: Path
    weights_bytes: int
    directory: Path = field(init=False)
    data: str = ""
    attempts: int = 0

    def __post_init__(self) -> None:
        self.directory = self.workdir


def module_bytes(model: Any) -> int:
    """Bytes of a torch module's parameters and buffers (shared storages counted once)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return 0
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            key = id(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def shared_weights_memo(module: Any) -> dict[int, Any]:
    """A deepcopy memo that gives each parameter and buffer a new tensor over the same storage."""
    import torch

    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad))
    for b in module.buffers():
        memo.setdefault(id(b), b.detach())
    return memo


def state(ctx: Any) -> LargeGraph | None:
    """The large-graph state of this export, decided once (before capture) from the module's weights."""
    if hasattr(ctx, "large_graph"):
        return ctx.large_graph
    from . import atomic

    size = module_bytes(ctx.model)
    large = None
    if ctx.options.external_data != "never" and size > ctx.options.external_data_threshold:
        large = LargeGraph(atomic.staging_dir(ctx.output_path), size)
    ctx.large_graph = large
    return large


def cleanup(ctx: Any) -> None:
    large = getattr(ctx, "large_graph", None)
    if large is not None:
        shutil.rmtree(large.workdir, ignore_errors=True)


def dynamo_graph(program: Any, ctx: Any) -> Any:
    """The captured graph of a torch.onnx ONNXProgram: in memory when small, else saved with external data
    (never one proto holding the weights) and loaded without them."""
    large = state(ctx)
    if large is None:
        return program.model_proto
    import onnx

    path = _fresh(large, "dynamo")
    program.save(str(path), external_data=True)
    model = onnx.load(str(path), load_external_data=False)
    large.directory, large.data = path.parent, path.name + ".data"
    _relocate(model, large, path.parent)
    return model


def load_captured(path: Path, ctx: Any) -> Any:
    """Load a graph an exporter wrote to ``path``; for a large model its weights are streamed, one tensor at a
    time, into one page-aligned data file in the work directory (the exporter's directory may go away)."""
    import onnx

    large = state(ctx)
    if large is None:
        return onnx.load(str(path))
    model = onnx.load(str(path), load_external_data=False)
    target = _fresh(large, "torchscript")
    large.directory, large.data = target.parent, target.name + ".data"
    _relocate(model, large, path.parent)
    return model


def _fresh(large: LargeGraph, exporter: str) -> Path:
    large.attempts += 1
    return large.workdir / f"capture-{large.attempts}-{exporter}.onnx"


def _tensors(model: Any) -> list[Any]:
    from onnx.external_data_helper import _get_all_tensors

    return list(_get_all_tensors(model))


def _relocate(model: Any, large: LargeGraph, base: Path) -> None:
    """Every big tensor into ``large.directory / large.data`` (copied in chunks if it lives elsewhere)."""
    from onnx import TensorProto
    from onnx.external_data_helper import uses_external_data

    data = large.directory / large.data
    same_file = {}
    for t in _tensors(model):
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            same_file[id(t)] = (base / info["location"]).resolve() == data.resolve()
    if same_file and all(same_file.values()) and not any(
            t.HasField("raw_data") and len(t.raw_data) >= _EMBED_LIMIT for t in _tensors(model)):
        return  # already one file where it belongs (the dynamo path)
    tmp = data.with_name(data.name + ".part")
    with open(tmp, "wb") as out:
        for t in _tensors(model):
            if uses_external_data(t):
                info = {e.key: e.value for e in t.external_data}
                src, offset = base / info["location"], int(info.get("offset", 0))
                length = int(info["length"]) if "length" in info else os.path.getsize(src) - offset
                start = _pad(out)
                with open(src, "rb") as f:
                    f.seek(offset)
                    _copy(f, out, length)
            elif t.HasField("raw_data") and len(t.raw_data) >= _EMBED_LIMIT:
                start, length = _pad(out), len(t.raw_data)
                out.write(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            for key, value in (("location", large.data), ("offset", str(start)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            t.data_location = TensorProto.EXTERNAL
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, data)


def _pad(out: Any) -> int:
    pos = out.tell()
    if pos % _ALIGN:
        out.write(b"\0" * (_ALIGN - pos % _ALIGN))
    return out.tell()


def _copy(src: Any, dst: Any, length: int) -> None:
    while length > 0:
        block = src.read(min(length, 8 << 20))
        if not block:
            raise OSError("external data file ends early")
        dst.write(block)
        length -= len(block)


def check(model: Any, ctx: Any) -> None:
    """The capture check, from a file: the full ONNX checker and an onnxruntime load."""
    import onnx

    large = state(ctx)
    path = large.directory / "check.onnx"
    onnx.save_model(model, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
        session(path)
    finally:
        path.unlink(missing_ok=True)


def session(path: Path) -> Any:
    """An onnxruntime CPU session read from ``path`` (external data mapped, no prepacked weight copies)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def save(model: Any, path: Path, ctx: Any) -> list[Path]:
    """Write the slim graph at ``path`` and move its data file beside it as ``<name>.data``."""
    import onnx

    large = state(ctx)
    data_name = path.name + ".data"
    for t in _tensors(model):
        for e in t.external_data:
            if e.key == "location" and e.value == large.data:
                e.value = data_name
    os.replace(large.directory / large.data, path.with_name(data_name))
    large.directory, large.data = path.parent, data_name
    onnx.save_model(model, str(path))
    return [path, path.with_name(data_name)]


def optimize_note(large: LargeGraph) -> str:
    return (f"skipped: {large.weights_bytes} bytes of weights past external_data_threshold; onnxsim would "
            "hold the whole model in memory twice")


def device_parity_note(report: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Large graphs get fp32 parity from the written file; the device-precision emulation, which needs the
    weights in memory (and a rounded copy of them), is reported as not run."""
    large = state(ctx)
    report["precision"] = {"emulated": False, "reason": f"skipped: {large.weights_bytes} bytes of weights past "
                           "external_data_threshold; the emulation would hold the model in memory twice"}
    return report
