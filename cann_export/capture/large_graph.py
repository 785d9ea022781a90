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

from ..decisions import module_bytes

_ALIGN = 4096  # page-aligned tensors let onnxruntime map them instead of copying
_EMBED_LIMIT = 1024  # tensors below this stay inside the proto
_PROTO_LIMIT = 2_000_000_000
_FOLD_LIMIT = 8192  # elements: onnxscript's own constant-folding input limit (it folds a Transpose past it)


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


def state(ctx: Any) -> LargeGraph | None:
    """The large-graph state of this export (``Decisions.large_graph``, decided after load from the module's
    weights), its work directory made at the first call; capture calls it before its first exporter, so a graph
    past protobuf's limit under --external-data never is refused there."""
    if ctx.large_graph is not None or ctx.decisions is None:
        return ctx.large_graph
    never = ctx.options.external_data == "never"
    if not (ctx.decisions.large_graph or (never and ctx.decisions.module_bytes > _PROTO_LIMIT)):
        return None
    size = module_bytes(ctx.model)  # the module as captured: train and strip ran since the decision
    if never:
        if size > _PROTO_LIMIT:
            from ..errors import CaptureError

            raise CaptureError(f"the model has {size} bytes of weights, past protobuf's 2 GB limit for one .onnx "
                               "file; use --external-data auto (or always)", path=ctx.loaded.source_path)
        return None
    from ..fs import atomic

    ctx.large_graph = LargeGraph(atomic.staging_dir(ctx.output_path), size)
    return ctx.large_graph


def cleanup(ctx: Any) -> None:
    large = ctx.large_graph
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


def optimize_keeping_weights(program: Any) -> None:
    """torch.onnx's optimisation (onnxscript's optimizer, then its fusions) without folding a Transpose of a
    weight: folded, each transposed weight is a new tensor (the capture holds the weights twice) that the module
    does not hold (parity's onnxruntime session holds them once more). Kept, the graph's weights are the module's
    own tensors, and the Transpose is folded where the graph is compiled (ATC, onnxruntime's session)."""
    import onnxscript
    from onnxscript.rewriter import onnx_fusions

    def fold(node: Any) -> bool | None:
        large = any(v is not None and v.const_value is not None and v.const_value.size > _FOLD_LIMIT
                    for v in node.inputs)
        return False if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and large else None

    onnxscript.optimizer.optimize_ir(program.model, input_size_limit=_FOLD_LIMIT, should_fold=fold)
    onnx_fusions.fuse(program.model)


def load_captured(path: Path, ctx: Any) -> Any:
    """Load a graph an exporter wrote to ``path``; for a large model its weights are streamed, one tensor at a
    time, into one page-aligned data file in the work directory (the exporter's directory may go away)."""
    import onnx

    large = state(ctx)
    if large is None:  # read one weight at a time: no second copy of the file's bytes
        from ..graph.onnx_stream import load

        return load(path)
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
    """The capture check, from a file: the full ONNX checker, and an onnxruntime load unless parity will
    load the written graph (one load of the weights, not two)."""
    import onnx

    large = state(ctx)
    path = large.directory / "check.onnx"
    onnx.save_model(model, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
        if not ctx.options.validate:  # else parity loads the written file in onnxruntime
            session(path)
    finally:
        path.unlink(missing_ok=True)


def session(path: Path, quantized: bool = False) -> Any:
    """An onnxruntime CPU session read from ``path`` (external data mapped, no prepacked weight copies); a Q/DQ
    graph's as parity runs one (onnx_helpers.for_qdq)."""
    from ..graph.onnx_helpers import check_session, for_qdq, session_options

    opts = session_options()
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return check_session(str(path), opts, disabled_optimizers=for_qdq(opts) if quantized else [])


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


_SHARED: dict[str, Any] = {}  # written graph path -> the export's torch module, while its parity runs


class sharing:
    """While parity runs on ``ctx.onnx_path``, let ``parity_session`` hand onnxruntime the caller's tensors
    for initializers whose bytes in the written data file are the same, byte for byte."""

    def __init__(self, ctx: Any) -> None:
        self.key = str(ctx.onnx_path) if ctx.large_graph is not None else None
        self.model = ctx.model

    def __enter__(self) -> None:
        if self.key:
            _SHARED[self.key] = self.model

    def __exit__(self, *exc: object) -> None:
        if self.key:
            _SHARED.pop(self.key, None)


def parity_session(path: Path, quantized: bool = False) -> Any:
    """A session on the written graph at ``path``, or None when it is not a large export's graph.

    Each initializer stored in the data file whose dtype, shape and bytes equal the module's tensor of that
    name (compared by streaming the file) becomes a graph input fed with that tensor's memory, so
    onnxruntime does not hold the weights a second time; what runs is still, byte for byte, what was written.
    """
    module = _SHARED.get(str(path))
    if module is None:
        return None
    return _fed_session(path, module, quantized=quantized)


def run_session(model: Any, ctx: Any) -> Any:
    """A session on a slim graph of this export whose data file is in the work directory (the opset check of
    a down-converted capture), fed the module's tensors where the file holds the same bytes, as parity is."""
    import onnx

    large = state(ctx)
    path = large.directory / f".run-{large.attempts}.onnx"  # beside the data file; gone before return
    onnx.save_model(model, str(path))
    try:
        return _fed_session(path, ctx.model)
    finally:
        path.unlink(missing_ok=True)


def fed_session(path: Path, module: Any) -> Any:
    """A session on the graph at ``path`` fed ``module``'s tensors where its data file holds the same bytes (as
    parity's), or None where it holds none of them (a graph without external data)."""
    return _fed_session(path, module, plain=lambda _: None)


def _fed_session(path: Path, module: Any, plain: Any = None, quantized: bool = False) -> Any:
    import onnx
    from onnx import helper
    from onnx.external_data_helper import uses_external_data

    tensors = dict(module.state_dict(keep_vars=True))
    graph = onnx.load(str(path), load_external_data=False)
    shared: dict[str, Any] = {}
    for init in graph.graph.initializer:
        t = tensors.get(init.name)
        t = tensors.get(init.name.removeprefix("model.")) if t is None else t
        if t is None or not uses_external_data(init) or t.device.type != "cpu" or not t.is_contiguous():
            continue
        try:
            arr = t.detach().numpy()
        except TypeError:  # a dtype numpy has not (bfloat16): read from the file
            continue
        if list(arr.shape) != list(init.dims) or helper.tensor_dtype_to_np_dtype(init.data_type) != arr.dtype:
            continue
        info = {e.key: e.value for e in init.external_data}
        if _same_bytes(path.parent / info["location"], int(info.get("offset", 0)), arr):
            shared[init.name] = arr
    if not shared:
        return plain(path) if plain is not None else session(path, quantized)
    kept = [t for t in graph.graph.initializer if t.name not in shared]
    fed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
           for t in graph.graph.initializer if t.name in shared]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)
    graph.graph.input.extend(fed)
    view = path.with_name(f".{path.name}.parity-view.onnx")  # beside the data file; gone before return
    onnx.save_model(graph, str(view))
    try:
        return _FedSession(session(view, quantized), shared)
    finally:
        view.unlink(missing_ok=True)


class _FedSession:
    """An onnxruntime session whose weight inputs are always fed from the module's tensors."""

    def __init__(self, inner: Any, weights: dict[str, Any]) -> None:
        self.inner, self.weights = inner, weights

    def get_inputs(self) -> list[Any]:
        return [i for i in self.inner.get_inputs() if i.name not in self.weights]

    def get_outputs(self) -> list[Any]:
        return self.inner.get_outputs()

    def run(self, names: Any, feed: dict[str, Any]) -> Any:
        return self.inner.run(names, {**feed, **self.weights})


def _same_bytes(data: Path, offset: int, arr: Any) -> bool:
    view = memoryview(arr.reshape(-1).view("uint8"))
    buf = bytearray(8 << 20)
    with open(data, "rb") as f:
        f.seek(offset)
        pos = 0
        while pos < len(view):
            n = f.readinto(memoryview(buf)[: min(len(buf), len(view) - pos)])
            if not n or buf[:n] != view[pos:pos + n]:
                return False
            pos += n
    return True
