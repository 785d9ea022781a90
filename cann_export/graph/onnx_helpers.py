"""Small ONNX graph helpers shared by the stages (imports onnx lazily through callers)."""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import onnx

_ELEM_TYPE_NAMES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def weights_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the graph's weights: a ``raw_data`` weight's from its type and shape (reading the field copies
    it: GPT-2 small's 500 MB, 0.2 CPU-s a call), any other's serialised size."""
    import math

    from .weightless_check import ITEMSIZE

    def size(t: Any) -> int:
        if t.HasField("raw_data") and t.data_type in ITEMSIZE:
            return math.prod(t.dims) * ITEMSIZE[t.data_type]
        return len(t.raw_data) or t.ByteSize()

    return sum(size(t) for t in model.graph.initializer)


def session_options(arena: bool = False) -> Any:
    """The onnxruntime CPU session options every session of the tool starts from: its warnings (coloured, on
    stderr) kept to itself; no memory arena unless ``arena`` (check_session turns it on and shrinks it after each
    run); pool threads that sleep while they wait; and at most ``OMP_NUM_THREADS`` intra-op threads when the user
    set it. onnxruntime itself ignores that variable and spins a thread per core, which on a shared machine spins
    against torch's pool and other processes that were told to share the cores."""
    import os

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    # a pool thread waiting for work sleeps instead of spinning (as the CLI's OMP_WAIT_POLICY=PASSIVE for torch):
    # on cores shared with other work, ResNet-18's parity runs took 1.3 -> 0.9 CPU s at a load of 23 on 2 cores
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if limit.isdigit() and 0 < int(limit) <= 4096:
        options.intra_op_num_threads = int(limit)
    return options


def session(model: onnx.ModelProto | str | Path) -> Any:
    """A CPU onnxruntime session of the checks (check_session)."""
    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return check_session(source, session_options())


def for_qdq(options: Any) -> list[str]:
    """``options`` for a Q/DQ graph's checks, and the optimizers to disable: the basic level only (the extended
    level fuses Q/DQ into u8s8 int8 kernels, which saturate on AVX2 CPUs without VNNI, onnxruntime's quantization
    docs), without WeightBiasQuantization (it rounds a float bias after Q/DQ inputs to int32 at input x weight
    scale: 6e-5 relative on a MobileNetV3 squeeze-excite conv, which later rounding points carry on to the output as
    several 8-bit steps)."""
    import onnxruntime as ort

    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ["WeightBiasQuantization"]


SHRINK = ("memory.enable_memory_arena_shrinkage", "cpu:0")  # a run's arena memory goes back when it ends


def check_session(source: str | bytes, options: Any, **kwargs: Any) -> Any:
    """A CPU onnxruntime session (``options``: session_options, ``kwargs``: InferenceSession's) on onnxruntime's
    arena that gives a run's memory back when the run ends (the arena shrinks: SHRINK), so sessions living together
    hold none of their runs. Without the arena every intermediate was a malloc of its own, which glibc kept: a
    ViT-small run at batch 16 raised the RSS by 529 MiB (80 with the arena) and left it there; a Whisper encoder's
    emulated runs took 3.1 CPU-s against 2.0 (page faults). The arena's first region (as large as the first tensor of
    the first run) is kept."""
    options.enable_cpu_mem_arena = True
    return _returning_session()(source, options, providers=["CPUExecutionProvider"], **kwargs)


def _returning_session() -> type:
    import onnxruntime as ort

    global _RETURNING
    if _RETURNING is None:
        class ReturningSession(ort.InferenceSession):
            """An InferenceSession whose runs end by shrinking its arena (unless given their own RunOptions)."""

            def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
                if run_options is None:
                    run_options = ort.RunOptions()
                    run_options.add_run_config_entry(*SHRINK)
                return super().run(output_names, input_feed, run_options)

        _RETURNING = ReturningSession
    return _RETURNING


_RETURNING: type | None = None


def check_graph(model: onnx.ModelProto, path: Path | None = None, loaded: bool = False, checked: bool = False) -> None:
    """Full ONNX check plus an onnxruntime load (``loaded``: onnxruntime already loaded this very graph;
    ``checked``: the full check passed on it); raises with the checker's/runtime's message. An in-memory graph is
    written (streamed) to a temporary file that both read: the checker and onnxruntime given a ModelProto each
    serialise it whole (DistilBERT's capture peak +136 MiB over the graph; from a file +94, ViT 274 -> 169)."""
    from . import onnx_stream

    if path is None and onnx_stream.streamable(model):  # both read a file: no serialised copies of the graph
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cann-export-check-") as tmp:
            path = Path(tmp) / "graph.onnx"
            onnx_stream.save(model, path)
            if not checked:
                onnx.checker.check_model(str(path), full_check=True)
            if not loaded:
                session(path)
        return
    if path is not None:
        onnx.checker.check_model(str(path), full_check=True)
        session(path)
    else:
        if not checked:
            onnx.checker.check_model(model, full_check=True)
        if not loaded:
            session(model)


def describe_values(values: Any) -> list[dict[str, Any]]:
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        out.append({"name": v.name, "shape": dims, "dtype": _ELEM_TYPE_NAMES.get(t.elem_type, str(t.elem_type))})
    return out


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    counts = collections.Counter(
        (f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def set_metadata(model: onnx.ModelProto, items: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in items.items():
        if key in existing:
            existing[key].value = str(value)
        else:
            model.metadata_props.add(key=key, value=str(value))


def cleanup_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Fold BatchNormalization into the Conv / ConvTranspose / Gemm before it (onnxscript's rewriter rules),
    bypass Identity nodes and drop unused nodes and initializers (onnx_ir's passes). A folded Conv keeps the
    Conv's origin and names the BatchNorm (module_paths). Returns the new graph and what changed; ``model``
    itself, changed in place, when only Identity nodes go (no onnxscript import, no onnx_ir round trip copying
    every weight: a TorchScript capture's usual graph)."""
    done = _cleaned_in_place(model)
    if done is not None:
        return model, done
    import onnx_ir as ir
    from onnx_ir.passes import common
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import (
        fuse_batchnorm_into_conv_rule,
        fuse_batchnorm_into_conv_transpose_rule,
        fuse_batchnorm_into_gemm_rule,
    )

    from .module_paths import remember_folds, restore_folds

    def count(op: str) -> int:
        return sum(1 for n in ir_model.graph if n.op_type == op)

    ir_model = ir.from_proto(model)
    bn, identities = count("BatchNormalization"), count("Identity")
    folds = remember_folds(ir_model.graph)
    rules = [fuse_batchnorm_into_conv_rule, fuse_batchnorm_into_conv_transpose_rule, fuse_batchnorm_into_gemm_rule]
    ir_model = rewriter.rewrite(ir_model, pattern_rewrite_rules=rules)
    restore_folds(ir_model.graph, folds)
    common.IdentityEliminationPass()(ir_model)
    common.RemoveUnusedNodesPass()(ir_model)  # also drops the initializers nothing reads any more
    report = {"conv_bn_folded": bn - count("BatchNormalization"), "identities_removed": identities - count("Identity")}
    return ir.to_proto(ir_model), report


def _cleaned_in_place(model: onnx.ModelProto) -> dict[str, int] | None:
    """``cleanup_graph``'s work done on ``model`` itself when it is only bypassing Identity nodes (no
    BatchNormalization, no Identity that is a graph output, nothing unused once they are out, no subgraphs or
    local functions): what changed, else None with ``model`` untouched (the onnx_ir passes do the rest)."""
    g = model.graph
    if model.functions or g.sparse_initializer:
        return None
    outputs = {o.name for o in g.output}
    alias: dict[str, str] = {}
    for n in g.node:
        if n.op_type == "BatchNormalization" or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                    for a in n.attribute):
            return None
        if n.op_type == "Identity":
            if n.domain not in ("", "ai.onnx") or len(n.input) != 1 or len(n.output) != 1 or n.output[0] in outputs:
                return None
            alias[n.output[0]] = n.input[0]

    def source(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    kept = [n for n in g.node if n.op_type != "Identity"]
    used = outputs | {source(i) for n in kept for i in n.input}
    if not all(t.name in used for t in g.initializer) or not all(any(o in used for o in n.output) for n in kept):
        return None
    for n in kept:
        for k, name in enumerate(n.input):
            if name in alias:
                n.input[k] = source(name)
    for k in reversed([k for k, n in enumerate(g.node) if n.op_type == "Identity"]):
        del g.node[k]
    for k in reversed([k for k, v in enumerate(g.value_info) if v.name in alias]):
        del g.value_info[k]
    return {"conv_bn_folded": 0, "identities_removed": len(alias)}


def prune_initializers(model: onnx.ModelProto) -> None:
    """Drop initializers no node or graph output reads (onnx_ir's unused-value pass), in place."""
    import onnx_ir as ir
    from onnx_ir.passes import common

    ir_model = ir.from_proto(model)
    common.RemoveUnusedNodesPass()(ir_model)
    model.CopyFrom(ir.to_proto(ir_model))


def save_model(model: onnx.ModelProto, path: Path, external: bool = False,
               placed: dict[str, tuple[int, int]] | None = None) -> list[Path]:
    """Save a graph; with ``external`` the weights go to ``<name>.data`` beside it. ``placed``: filled with where
    each weight's bytes went in a graph written with its weights inline (onnx_stream.save)."""
    if external:
        data_name = path.name + ".data"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        return [path, path.with_name(data_name)]
    from . import onnx_stream

    if onnx_stream.streamable(model):  # the same bytes, without a serialised copy of the whole graph
        (placed if placed is not None else {}).update(onnx_stream.save(model, path))
    else:
        onnx.save_model(model, str(path))
    return [path]


def _skeleton(model: Any, input_shapes: dict[str, tuple[int, ...]] | None = None, shape_operands: bool = False) -> Any:
    """A copy of ``model`` for type and shape inference without weight data: each initializer a graph input of its
    type and shape (its bytes never serialised); ``input_shapes``: concrete shapes of graph inputs; small
    initializers (shape operands, Resize's scales) keep their data when ``input_shapes`` or ``shape_operands``, for
    the ops that read them (Reshape's shape)."""
    from onnx import helper

    g = model.graph
    inits = [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in g.initializer]
    shapes = input_shapes or {}
    inputs = [helper.make_tensor_value_info(i.name, i.type.tensor_type.elem_type, list(shapes[i.name]))
              if i.name in shapes else i for i in g.input]
    small = [i for i in g.initializer if (shapes or shape_operands) and len(i.dims) <= 1
             and (not i.dims or i.dims[0] <= 16)]
    skeleton = helper.make_graph(list(g.node), g.name or "g", inputs + inits, list(g.output), small)
    probe = helper.make_model(skeleton, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    probe.functions.extend(model.functions)
    return probe


def inferred_graph(model: Any) -> Any:
    """The graph of ``model`` after type and shape inference (strict mode off) on a copy without weight data: the
    weights' bytes are neither serialised nor copied (a whole-model infer_shapes held three copies of GPT-2's
    500 MB). Raises what inference raises."""
    import onnx

    return onnx.shape_inference.infer_shapes(_skeleton(model, shape_operands=True), strict_mode=False).graph


def declared_outputs_hold(model: Any) -> bool:
    """Whether strict type and shape inference, run without the weights' data, agrees with the graph's declared
    outputs: what the full check's inference asks of an output shape that was narrowed (a symbolic dim given its
    one size) after the full check passed on the file. False when inference raises for any reason (the caller
    then runs the full check)."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(_skeleton(model, shape_operands=True), check_type=True, strict_mode=True)
    except Exception:  # noqa: BLE001 - a conflict, or an op inference cannot take without data: not proven
        return False
    return True


def inferred_values(model: Any, input_shapes: dict[str, tuple[int, ...]] | None = None) -> list[Any]:
    """Every value's ValueInfo (weights included) by type and shape inference on a copy of the graph without
    weight data (the weights' bytes are never serialised for it); the declared ones where inference gives up.
    ``input_shapes``: concrete shapes of (dynamic) graph inputs, so the values they reach get concrete ones."""
    import onnx
    from onnx import helper

    g = model.graph
    shapes = input_shapes or {}
    probe = _skeleton(model, shapes)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=bool(shapes)).graph
    except Exception:  # noqa: BLE001 - inference may give up on exotic graphs; fall back to declared types
        inits = [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in g.initializer]
        return list(g.value_info) + list(g.output) + list(g.input) + inits
    values = list(inferred.value_info) + list(inferred.output) + list(inferred.input)
    return _symbolic_sizes(probe, values) if shapes else values


def _sized(value: Any) -> bool:
    shape = value.type.tensor_type.shape
    return value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in shape.dim)


def _symbolic_sizes(probe: Any, values: list[Any]) -> list[Any]:
    """``values`` with the shapes onnx's inference left symbolic at concrete input shapes filled in by
    onnxruntime's symbolic inference, which computes shape arithmetic onnx's data propagation gives up on (GPT-2's
    causal-mask Slice, whose unknown size reached every value after it); ``values`` as they are where it fails."""
    if all(_sized(v) for v in values):
        return values
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        graph = SymbolicShapeInference.infer_shapes(probe, auto_merge=False, guess_output_rank=False).graph
    except Exception:  # noqa: BLE001 - an op it does not know, a conflict: keep onnx's answer
        return values
    found = {v.name: v for v in [*graph.value_info, *graph.output] if _sized(v)}
    return [v if _sized(v) else found.get(v.name, v) for v in values]


def graph_dims(model: Any) -> dict[str, list[int | str]]:
    """{input: [size or dim name]} of a graph's inputs (initializers left out)."""
    initializers = {i.name for i in model.graph.initializer}
    out: dict[str, list[int | str]] = {}
    for v in model.graph.input:
        if v.name in initializers or not v.type.HasField("tensor_type"):
            continue
        out[v.name] = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    return out
