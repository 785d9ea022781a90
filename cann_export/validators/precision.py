"""Device-precision emulation: run the graph the way an Ascend NPU computes it under a precision mode.

The device rule, per node, under a mode that lowers precision (force_fp16, fp16, the mixed modes ...):
- a *reduced* node (one the mode puts in fp16/bf16, and not in keep_dtype) reads every float input in
  fp16: an input produced in fp32 (a graph input, a kept node's output, a weight or constant) is cast to
  fp16 first; it computes with fp32 accumulation (cube units) and writes fp16 (past 65504 is inf);
- a *kept* node (keep_dtype, or an op the mode leaves in fp32) reads fp32 (an fp16 producer's value casts
  up exactly), keeps its weights and constants in fp32 and writes fp32;
- a weight or constant takes the precision of the node that reads it (ATC folds it into that node), so a
  constant read by a reduced and a kept node exists in both precisions;
- inputs that ATC resolves into shapes on the host (Resize roi/scales, Upsample scales, Range) are not
  rounded.

The emulation is an fp32 graph in which a value is rounded by a Cast(fp16) -> Cast(fp32) pair: after each
reduced node's float outputs, and before a reduced node for each fp32-produced input; weights are rounded
once in numpy. onnxruntime's graph optimisations are off so no pair is folded away. (Converting the graph
to fp16 and running it on onnxruntime's CPU provider does not reproduce device overflow: that provider
computes many fp16 nodes in fp32 and drops the casts between them.)

Modes (ATC precision_mode / precision_mode_v2) and the nodes they reduce:
- force_fp16, fp16: every node.
- allow_fp32_to_fp16: the cube ops (Conv, ConvTranspose, MatMul, Gemm), which are fp16-only on inference
  SoCs; every other op has an fp32 implementation and keeps fp32.
- cube_fp16in_fp32out: the cube ops read fp16 and write fp32 (outputs are not rounded).
- allow_mix_precision(_fp16), mixed_float16: the op types on the mixed-precision allow list.
- allow_mix_precision_bf16, mixed_bfloat16, allow_fp32_to_bf16: as the mixed modes, in bfloat16.
- mixed_hif8: approximated as mixed_float16 (HiFloat8 is not emulated).
- must_keep_origin_dtype, origin, force_fp32: none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
# Ascend's mixed-precision allow list (ops_info "precision_reduce" = true) mapped to ONNX op types:
# the cube ops plus the pooling / activation ops that follow them in fp16.
MIXED_ALLOW = CUBE_OPS | {"AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool", "Relu", "LeakyRelu",
                          "Conv1d", "Einsum"}
# ops that only move or select elements: rounding their outputs equals rounding their inputs, so when the
# outputs are rounded their inputs are read as they are (no copy of a 30k-row embedding table is rounded)
DATA_MOVEMENT = frozenset({"Gather", "GatherElements", "GatherND", "Reshape", "Transpose", "Slice", "Concat",
                           "Split", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Tile", "Where",
                           "Pad", "DepthToSpace", "SpaceToDepth"})
SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}  # folded into shapes by ATC
FP16, BF16 = 10, 16  # onnx.TensorProto.FLOAT16 / BFLOAT16
FLOAT = 1
FED_MIN = 1024  # float weights with at least this many elements are fed at run time, not serialised
EPSILON = {FP16: 2.0 ** -10, BF16: 2.0 ** -7, FLOAT: 2.0 ** -23}  # machine epsilon of each dtype


@dataclass(frozen=True)
class Emulation:
    mode: str
    reduces: str  # which nodes compute in reduced precision: "all", "cube", "mixed", "none"
    rounds_outputs: bool  # False for cube_fp16in_fp32out
    dtype: int  # FP16 or BF16
    description: str

    @property
    def epsilon(self) -> float:
        return EPSILON[self.dtype]


def emulation_for(mode: str) -> Emulation:
    if mode in ("force_fp16", "fp16"):
        return Emulation(mode, "all", True, FP16, "every node in fp16 (fp16 inputs, fp32 accumulation, fp16 "
                         "outputs) except keep_dtype nodes, which read, keep and write fp32")
    if mode == "allow_fp32_to_fp16":
        return Emulation(mode, "cube", True, FP16, "cube ops (Conv/MatMul/Gemm) in fp16, fp32 elsewhere")
    if mode == "cube_fp16in_fp32out":
        return Emulation(mode, "cube", False, FP16, "cube ops read fp16 and write fp32")
    if mode in ("allow_mix_precision", "allow_mix_precision_fp16", "mixed_float16", "mixed_hif8"):
        note = " (HiFloat8 approximated by fp16)" if mode == "mixed_hif8" else ""
        return Emulation(mode, "mixed", True, FP16, "fp16 for op types on the mixed-precision allow list" + note)
    if mode in ("allow_mix_precision_bf16", "mixed_bfloat16", "allow_fp32_to_bf16"):
        return Emulation(mode, "mixed", True, BF16, "bf16 for op types on the mixed-precision allow list")
    return Emulation(mode, "none", True, FLOAT, "none: fp32 as exported")


def round_array(arr: np.ndarray, dtype: int) -> np.ndarray:
    """fp32 -> fp16/bf16 -> fp32 (round to nearest even; past the range is inf)."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == FP16:
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    bits = arr.view(np.uint32)
    rounded = np.where(np.isnan(arr), bits | 0x00400000,  # quiet NaN stays NaN
                       (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def value_types(model: Any) -> tuple[set[str], dict[str, int]]:
    """Float32 value names and, where static, element counts, by type inference on a copy of the graph
    without weight data (the weights' bytes are never serialised for it)."""
    import onnx
    from onnx import helper

    g = model.graph
    inits = [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in g.initializer]
    skeleton = helper.make_graph(list(g.node), g.name or "g", list(g.input) + inits, list(g.output))
    probe = helper.make_model(skeleton, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    probe.functions.extend(model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False).graph
        values = list(inferred.value_info) + list(inferred.output) + list(inferred.input)
    except Exception:  # noqa: BLE001 - inference may give up on exotic graphs; fall back to declared types
        values = list(g.value_info) + list(g.output) + list(g.input) + inits
    floats, sizes = set(), {}
    for v in values:
        t = v.type.tensor_type
        if t.elem_type == FLOAT:
            floats.add(v.name)
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.HasField("shape") and all(d >= 0 for d in dims):
            sizes[v.name] = int(np.prod(dims)) if dims else 1
    return floats, sizes


class Emulator:
    """One graph, analysed once (value types, weights, rounded weights), emulated for any keep set."""

    def __init__(self, model: Any, mode: str):
        from onnx import numpy_helper

        self.model = model
        self.emulation = emulation_for(mode)
        self.floats, self.sizes = value_types(model)
        g = model.graph
        self.node_names = {n.name for n in g.node if n.name}
        self.fed = {i.name: numpy_helper.to_array(i) for i in g.initializer
                    if i.data_type == FLOAT and int(np.prod(i.dims)) >= FED_MIN}
        self.embedded = [i for i in g.initializer if i.name not in self.fed]
        self.init_names = {i.name for i in g.initializer}
        self.graph_inputs = [i for i in g.input if i.name not in self.init_names]
        self._rounded: dict[str, Any] = {}  # initializer name -> rounded copy (array or TensorProto)

    def reduced(self, node: Any, keep: set[str]) -> bool:
        """Whether the device computes ``node`` in reduced precision under this mode and keep set."""
        e = self.emulation
        if e.reduces == "none" or node.op_type == "Constant":  # constants take their reader's precision
            return False
        if node.name in keep or f"OpType::{node.op_type}" in keep:
            return False
        if e.reduces == "all":
            return True
        return node.op_type in (CUBE_OPS if e.reduces == "cube" else MIXED_ALLOW)

    def _rounded_init(self, name: str) -> tuple[str, Any]:
        from onnx import numpy_helper

        rname = f"{name}__r{self.emulation.dtype}"
        if name not in self._rounded:
            if name in self.fed:
                self._rounded[name] = round_array(self.fed[name], self.emulation.dtype)
            else:
                init = next(i for i in self.embedded if i.name == name)
                self._rounded[name] = numpy_helper.from_array(
                    round_array(numpy_helper.to_array(init), self.emulation.dtype), rname)
        return rname, self._rounded[name]

    def build(self, keep: set[str] | frozenset[str] = frozenset(), expose: list[str] | None = None,
              reference: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
        """The emulated graph (the plain fp32 graph when ``reference``) with the tensors in ``expose``
        added as outputs, and the weights to feed with every run."""
        from onnx import helper

        e, floats = self.emulation, self.floats
        dtype = e.dtype
        g = self.model.graph
        nodes: list[Any] = []
        weights = dict(self.fed)
        extra_inits: list[Any] = []
        rounded = set()  # values that already hold what a reduced node reads (fp16-representable)
        copies: dict[str, str] = {}  # fp32-produced value -> its rounded copy

        def pair(src: str, dst: str, tag: str) -> list[Any]:
            mid = f"{dst}__{tag}"
            return [helper.make_node("Cast", [src], [mid], to=dtype, name=f"{mid}_cast"),
                    helper.make_node("Cast", [mid], [dst], to=FLOAT, name=f"{mid}_back")]

        def read_rounded(name: str) -> str:
            if name not in copies:
                if name in self.init_names:
                    rname, value = self._rounded_init(name)
                    if isinstance(value, np.ndarray):
                        weights[rname] = value
                    else:
                        extra_inits.append(value)
                else:
                    rname = f"{name}__in{dtype}"
                    nodes.extend(pair(name, rname, "h"))
                copies[name] = rname
            return copies[name]

        for original in g.node:
            node = type(original)()
            node.CopyFrom(original)
            if reference or not self.reduced(node, set(keep)):
                nodes.append(node)
                continue
            skip = SHAPE_INPUTS.get(node.op_type, ())
            moves = e.rounds_outputs and node.op_type in DATA_MOVEMENT
            for k, name in enumerate(node.input):
                if name and name in floats and name not in rounded and k not in skip and not moves:
                    node.input[k] = read_rounded(name)
            nodes.append(node)
            if e.rounds_outputs:
                for k, name in enumerate(node.output):
                    if name in floats:
                        node.output[k] = f"{name}__fp32"
                        nodes.extend(pair(node.output[k], name, "o"))
                        rounded.add(name)
        return self._assemble(nodes, weights, extra_inits, expose), weights

    def _assemble(self, nodes: list[Any], weights: dict[str, np.ndarray], extra_inits: list[Any],
                  expose: list[str] | None) -> Any:
        """The model of ``nodes``: the weights fed as inputs, ``expose`` added to the outputs."""
        from onnx import helper

        g = self.model.graph
        outputs = list(g.output)
        present = {o.name for o in outputs}
        outputs += [helper.make_tensor_value_info(t, FLOAT, None) for t in expose or [] if t not in present]
        inputs = list(self.graph_inputs) + [helper.make_tensor_value_info(n, FLOAT, list(w.shape))
                                            for n, w in weights.items()]
        graph = helper.make_graph(nodes, g.name or "g", inputs, outputs, list(self.embedded) + extra_inits)
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        model.functions.extend(self.model.functions)
        return model

    def session(self, keep: set[str] | frozenset[str] = frozenset(), expose: list[str] | None = None,
                reference: bool = False) -> Session:
        model, weights = self.build(keep, expose, reference)
        return Session(model, weights)


class Session:
    """An onnxruntime session over a built graph, with its weights fed on every run."""

    def __init__(self, model: Any, weights: dict[str, np.ndarray]):
        self.sess = session(model)
        self.weights = weights
        self.inputs = [i.name for i in self.sess.get_inputs() if i.name not in weights]

    def run(self, feed: dict[str, np.ndarray], names: list[str] | None = None) -> list[np.ndarray]:
        return self.sess.run(names, {**{n: feed[n] for n in self.inputs}, **self.weights})


def emulate(model: Any, emulation: Emulation, keep: set[str]) -> Any:
    """A self-contained copy of ``model`` (weights embedded) that computes as the device does."""
    from onnx import numpy_helper

    emulator = Emulator(model, emulation.mode)
    built, weights = emulator.build(set(keep))
    fed = set(weights)
    kept_inputs = [i for i in built.graph.input if i.name not in fed]
    del built.graph.input[:]
    built.graph.input.extend(kept_inputs)
    built.graph.initializer.extend(numpy_helper.from_array(w, n) for n, w in weights.items())
    return built


def session(model: Any) -> Any:
    """An onnxruntime session with graph optimisations off, so Cast pairs are never folded away."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(model: Any, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    sess = session(model)
    names = [i.name for i in sess.get_inputs()]
    return [sess.run(None, {n: feed[n] for n in names}) for feed in feeds]
