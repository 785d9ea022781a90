"""Device-precision emulation: run the graph the way an Ascend NPU computes it under a precision mode.

Ascend's cube units take fp16 in, accumulate in fp32 and write fp16 out. Under force_fp16 / fp16 every
float tensor is therefore rounded to fp16 at each node boundary (past 65504 it becomes inf); weights are
stored in fp16. The emulation keeps fp32 compute and rounds each rounded node's outputs through a
Cast(fp16) -> Cast(fp32) pair, with onnxruntime's graph optimisations off so the pair is never folded.
(Converting the graph to fp16 and running it on onnxruntime's CPU provider does not reproduce device
overflow: that provider computes many fp16 nodes in fp32 and drops the casts between them.)

Modes (ATC precision_mode / precision_mode_v2):
- force_fp16, fp16: every node, except keep_dtype nodes, rounds its outputs to fp16; weights fp16.
- allow_fp32_to_fp16: ops that have an fp32 implementation keep fp32; on inference SoCs the cube ops
  (Conv, ConvTranspose, MatMul, Gemm) are fp16-only, so those round.
- cube_fp16in_fp32out: cube ops take fp16 inputs and write fp32.
- allow_mix_precision(_fp16), mixed_float16: only the op types on the mixed-precision allow list round.
- allow_mix_precision_bf16, mixed_bfloat16, allow_fp32_to_bf16: as the mixed modes, in bfloat16.
- mixed_hif8: approximated as mixed_float16 (HiFloat8 is not emulated).
- must_keep_origin_dtype, origin, force_fp32: nothing changes.
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
FP16, BF16 = 10, 16  # onnx.TensorProto.FLOAT16 / BFLOAT16
FLOAT = 1


@dataclass(frozen=True)
class Emulation:
    mode: str
    rounds: str  # "all", "cube", "cube_inputs", "mixed", "none"
    dtype: int  # FP16 or BF16
    description: str


def emulation_for(mode: str) -> Emulation:
    if mode in ("force_fp16", "fp16"):
        return Emulation(mode, "all", FP16, "fp16 at every node boundary (fp32 accumulation), fp16 weights")
    if mode == "allow_fp32_to_fp16":
        return Emulation(mode, "cube", FP16, "fp16 for cube ops (Conv/MatMul/Gemm), fp32 elsewhere")
    if mode == "cube_fp16in_fp32out":
        return Emulation(mode, "cube_inputs", FP16, "fp16 inputs to cube ops, fp32 outputs")
    if mode in ("allow_mix_precision", "allow_mix_precision_fp16", "mixed_float16", "mixed_hif8"):
        note = " (HiFloat8 approximated by fp16)" if mode == "mixed_hif8" else ""
        return Emulation(mode, "mixed", FP16, "fp16 for op types on the mixed-precision allow list" + note)
    if mode in ("allow_mix_precision_bf16", "mixed_bfloat16", "allow_fp32_to_bf16"):
        return Emulation(mode, "mixed", BF16, "bf16 for op types on the mixed-precision allow list")
    return Emulation(mode, "none", FLOAT, "none: fp32 as exported")


def _float_tensors(model: Any) -> set[str]:
    """Names of float32 values (inputs, outputs, intermediates) by shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference may give up on exotic graphs; fall back to declared types
        inferred = model
    g = inferred.graph
    values = list(g.value_info) + list(g.output) + list(g.input)
    return {v.name for v in values if v.type.tensor_type.elem_type == FLOAT}


def emulate(model: Any, emulation: Emulation, keep: set[str]) -> Any:
    """A copy of ``model`` whose rounded nodes pass their float outputs through a Cast pair.

    A node's output ``X`` is renamed ``X__fp32`` and the pair writes ``X`` again, so consumers and graph
    outputs read the rounded value and intermediate names stay comparable with the fp32 graph.
    """
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    if emulation.rounds == "none":
        return out
    floats = _float_tensors(out)
    keep_types = {k.split("::", 1)[1] for k in keep if k.startswith("OpType::")}
    g = out.graph
    new_nodes = []

    def cast_pair(src: str, dst: str, tag: str) -> list[Any]:
        mid = f"{dst}__{tag}"
        return [helper.make_node("Cast", [src], [mid], to=emulation.dtype, name=f"{mid}_cast"),
                helper.make_node("Cast", [mid], [dst], to=FLOAT, name=f"{dst}__{tag}_back")]

    def rounds(node: Any) -> bool:
        if node.name in keep or node.op_type in keep_types:
            return False
        if emulation.rounds == "all":
            return True
        if emulation.rounds in ("cube", "cube_inputs"):
            return node.op_type in CUBE_OPS
        return node.op_type in MIXED_ALLOW

    if emulation.rounds == "all":  # weights are stored in fp16 / bf16; graph inputs enter in it
        for init in g.initializer:
            if init.data_type == FLOAT:
                arr = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(_round(arr, emulation.dtype), init.name))
        for inp in g.input:
            if inp.name in floats:
                rounded = f"{inp.name}__in"
                for node in g.node:
                    node.input[:] = [rounded if i == inp.name else i for i in node.input]
                new_nodes += cast_pair(inp.name, rounded, "in16")
    for node in g.node:
        if not rounds(node):
            new_nodes.append(node)
            continue
        if emulation.rounds == "cube_inputs":
            for k, name in enumerate(node.input):
                if name in floats:
                    rounded = f"{name}__to_{node.name or k}"
                    new_nodes += cast_pair(name, rounded, "cube16")
                    node.input[k] = rounded
            new_nodes.append(node)
            continue
        new_nodes.append(node)
        for k, name in enumerate(node.output):
            if name in floats:
                node.output[k] = f"{name}__fp32"
                new_nodes += cast_pair(node.output[k], name, "r16")
    del g.node[:]
    g.node.extend(new_nodes)
    return out


def _round(arr: np.ndarray, dtype: int) -> np.ndarray:
    if dtype == FP16:
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    bits = arr.astype(np.float32).view(np.uint32)  # round-to-nearest-even to bfloat16
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


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
