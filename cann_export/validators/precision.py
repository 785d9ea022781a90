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

Overflow (a SoC's float overflow mode, options.SOC_OVERFLOW), at every rounding point of a reduced node's
value: "inf_nan" rounds as IEEE 754 (past 65504 is inf); "saturation" clips to +-65504 (bf16: its largest
finite value) and, after the ops that make NaN from finite inputs (Div 0/0, Sqrt/Log/Pow of a negative ...), sets
NaN to 0. Whatever the SoC, ATC converts fp32 weights and constants on the host (the graph engine's fp16_t,
TagFp16::operator=(float): an exponent past fp16's, inf and NaN become +-65504) and folds every node whose inputs
are all constants or shapes in fp32 before that conversion; so a mask filled with float32 min (-3.4e38) reads
-65504 on the device, never -inf. (fp16_t maps [65520, 65536) to its NaN pattern; not emulated.)

Modes (ATC precision_mode / precision_mode_v2) and the nodes they reduce:
- force_fp16, fp16: every node.
- allow_fp32_to_fp16: the cube ops (Conv, ConvTranspose, MatMul, Gemm), which are fp16-only on inference
  SoCs; every other op has an fp32 implementation and keeps fp32.
- cube_fp16in_fp32out: the cube ops read fp16 and write fp32 (outputs are not rounded).
- allow_mix_precision(_fp16), mixed_float16: by the SoC's mixed-precision lists (atc/mixlists.py, after any
  --modify-mixlist edits), in graph order: a node whose Ascend IR type (atc/ascend_ir.py) is on the white list is
  reduced, one on the black list keeps fp32, any other (gray) follows the producer of its first float input
  (reduced when that node is; a graph input, weight or constant is fp32).
- allow_mix_precision_bf16, mixed_bfloat16, allow_fp32_to_bf16: as the mixed modes, in bfloat16.
- mixed_hif8: the fp16 lists, white ops rounded to fp16: HiFloat8 (8-bit, tapered precision) is not emulated,
  so an op ATC would run in HiF8 is emulated coarser-than-fp32 but finer than on the device (hints warn).
- must_keep_origin_dtype, origin, force_fp32: none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    from ..atc.customize import Custom
    from ..atc.mixlists import MixLists

CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
# ops that only move or select elements: rounding their outputs equals rounding their inputs, so when the
# outputs are rounded their inputs are read as they are (no copy of a 30k-row embedding table is rounded)
DATA_MOVEMENT = frozenset({"Gather", "GatherElements", "GatherND", "Reshape", "Transpose", "Slice", "Concat",
                           "Split", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Tile", "Where",
                           "Pad", "DepthToSpace", "SpaceToDepth"})
SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}  # folded into shapes by ATC
FP16, BF16 = 10, 16  # onnx.TensorProto.FLOAT16 / BFLOAT16
FLOAT = 1
SATURATION, INF_NAN = "saturation", "inf_nan"  # options.OVERFLOW_MODES
LARGEST = {FP16: 65504.0, BF16: float(np.frombuffer(np.uint32(0x7F7F0000).tobytes(), np.float32)[0]),
           FLOAT: float(np.finfo(np.float32).max)}  # the largest finite value of each dtype
# ops that can make NaN from finite inputs; only their outputs need NaN -> 0 in saturation mode (every other
# op of finite, saturated inputs stays finite)
NAN_SOURCES = frozenset({"Div", "Sqrt", "Log", "Pow", "Mod", "Acos", "Asin", "Acosh", "Atanh", "ReduceLogSum",
                         "ReduceLogSumExp"})
HOST_SOURCES = frozenset({"Shape", "Size", "Constant"})  # outputs ATC knows at build time (static shapes)
FED_MIN = 1024  # float weights with at least this many elements are fed at run time, not serialised
DTYPE_OF = {"float16": "fp16", "bfloat16": "bf16", "float": "fp32", "float32": "fp32"}  # customize_dtypes' names
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
        return Emulation(mode, "mixed", True, FP16, "fp16 for the white-list op types of the SoC's mixed-precision "
                         "lists, fp32 for the black list, gray ops following their producer" + note)
    if mode in ("allow_mix_precision_bf16", "mixed_bfloat16", "allow_fp32_to_bf16"):
        return Emulation(mode, "mixed", True, BF16, "bf16 for the white-list op types of the SoC's mixed-precision "
                         "lists, fp32 for the black list, gray ops following their producer")
    return Emulation(mode, "none", True, FLOAT, "none: fp32 as exported")


def atc_convert(arr: np.ndarray, dtype: int) -> np.ndarray:
    """fp32 -> fp16/bf16 -> fp32 as ATC converts a weight or constant: round to nearest even, and a value past the
    range, inf or NaN becomes the largest finite value of its sign (fp16_t's saturation; bf16 assumed alike)."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    largest = np.float32(LARGEST[dtype])
    if not in_range(arr, dtype):
        arr = np.where(np.isnan(arr), np.copysign(largest, arr), np.clip(arr, -largest, largest)).astype(np.float32)
    return round_array(arr, dtype)


def in_range(arr: np.ndarray, dtype: int) -> bool:
    """Whether every element of ``arr`` is finite and within ``dtype``'s range (converting it saturates nothing)."""
    if not arr.size:
        return True
    largest = LARGEST[dtype]  # min and max, no temporary array: NaN makes either comparison false, as inf does
    return bool(-largest <= float(arr.min()) and float(arr.max()) <= largest)


def round_array(arr: np.ndarray, dtype: int) -> np.ndarray:
    """fp32 -> fp16/bf16 -> fp32 (round to nearest even; past the range is inf)."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == FP16:
        # numpy's conversion, one thread: torch's (multi-threaded) left its OpenMP threads spinning against the
        # onnxruntime run that follows, 2.5-4x the check's time on a loaded machine (benchmarks/bench_precision.py)
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    bits = arr.view(np.uint32)
    rounded = np.where(np.isnan(arr), bits | 0x00400000,  # quiet NaN stays NaN
                       (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def value_types(model: Any, input_shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[set[str], dict[str, int]]:
    """Float32 value names and, where static, element counts, by type inference on a weight-free copy of the
    graph; ``input_shapes``: at these input shapes (a dynamic graph's values then get concrete sizes)."""
    from ..graph.onnx_helpers import inferred_values

    floats, sizes = set(), {}
    for v in inferred_values(model, input_shapes):
        t = v.type.tensor_type
        if t.elem_type == FLOAT:
            floats.add(v.name)
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.HasField("shape") and all(d >= 0 for d in dims):
            sizes[v.name] = int(np.prod(dims)) if dims else 1
    return floats, sizes


def host_values(model: Any) -> set[str]:
    """Values ATC knows when it builds the model (weights, constants, shapes with static input shapes, and what
    nodes compute from them alone): it folds them on the host in fp32 and converts the result with fp16_t."""
    known = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in HOST_SOURCES or (any(node.input) and all(not i or i in known for i in node.input)):
            known.update(o for o in node.output if o)
    return known


def fed_weight(init: Any) -> bool:
    """Whether the emulator feeds initializer ``init`` with every run (a float weight of FED_MIN elements or more)
    rather than keeping it in the graph."""
    return init.data_type == FLOAT and int(np.prod(init.dims)) >= FED_MIN


def fed_weights(path: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """The graph at ``path`` and the weights an Emulator of it feeds, each read once: the graph holds those by
    name, type and dims alone (``Emulator(model, ..., fed=weights)``), so the weights are in memory once. A weight
    in external data is read from its file beside the graph (onnx resolves and checks the location) into its array:
    read into the graph instead, a component past 2 GB made an emulated graph protobuf cannot serialise."""
    import os

    from onnx import numpy_helper

    from ..graph.onnx_stream import load

    fed: dict[str, np.ndarray] = {}
    base = os.path.dirname(str(path))

    def divert(init: Any) -> bool:
        if not fed_weight(init):
            return False
        fed[init.name] = numpy_helper.to_array(init, base)
        return True

    return load(path, divert=divert), fed


class Emulator:
    """One graph, analysed once (value types, weights, rounded weights), emulated for any keep set.

    ``overflow``: the SoC's float overflow mode, "saturation" or "inf_nan" (see the module docstring);
    ``deq_scale``: how the SoC holds AscendDequant's scale (int8_device.deq_scale_for) for a graph with Q/DQ,
    whose quantized ops the emulation runs on the int8 path (validators/int8_device.py); ``lists``: the SoC's
    mixed-precision lists (atc/mixlists.lists_for) the mixed modes reduce by (None: the default family's), with
    the customize_dtypes entries (atc/customize.py) whose nodes read and write the dtypes they name."""

    def __init__(self, model: Any, mode: str, overflow: str = INF_NAN, deq_scale: str = "s19",
                 lists: MixLists | None = None, fed: dict[str, np.ndarray] | None = None):
        from onnx import numpy_helper

        from . import int8_device

        if overflow not in (SATURATION, INF_NAN):
            raise ValueError(f"overflow mode {overflow!r} is neither {SATURATION!r} nor {INF_NAN!r}")
        self.model = model
        self.emulation = emulation_for(mode)
        self.overflow = overflow
        self.floats, self.sizes = value_types(model)
        g = model.graph
        self.node_names = {n.name for n in g.node if n.name}
        # ``fed``: the weights already read (fed_weights), left out of ``model`` but for their name, type and dims
        self.fed = fed if fed is not None else {i.name: numpy_helper.to_array(i) for i in g.initializer
                                                if fed_weight(i)}
        self.weights_read = self.fed  # the graph's own weights (shared_emulators gives them to the next Emulator)
        self.embedded = [i for i in g.initializer if i.name not in self.fed]
        self.init_names = {i.name for i in g.initializer}
        self.graph_inputs = [i for i in g.input if i.name not in self.init_names]
        self.host = host_values(model)
        self.producer_op = {o: n.op_type for n in g.node for o in n.output if o}
        self.lists = lists
        self._ascend: dict[str, str] | None = None  # node name -> Ascend IR type, when first needed
        self._mixed: dict[frozenset[str], set[str]] = {}  # keep set -> the nodes the mixed lists reduce
        self._rounded: dict[str, Any] = {}  # initializer name -> rounded copy (array or TensorProto)
        self._in_range: dict[str, bool] = {}  # initializer name -> converting it saturates nothing
        # the AMCT-adapted int8 path of a Q/DQ graph (None without QuantizeLinear, or when nothing is reduced)
        self.int8 = int8_device.plan(model, deq_scale) if self.emulation.reduces != "none" else None
        self._kept: tuple[tuple[frozenset[str], tuple[str, ...]], Session] | None = None  # reused_session's
        self.folded = self._fold_weight_ops() if self.int8 is None else set()

    def _fold_weight_ops(self) -> set[int]:
        """The graph's nodes that compute a large float value from weights alone (the Transpose of a tied
        embedding that passes/dedupe.py leaves for the LM head), computed here once, in fp32 as ATC folds them on
        the host, and fed from then on as weights (``fed``): the emulated and reference graphs run no optimiser, so
        each run transposed GPT-2's 38.6M-element embedding and rounded the copy again (0.3 s a run). Their indices."""
        from onnx import AttributeProto, helper

        g = self.model.graph
        found = [(k, n) for k, n in enumerate(g.node)
                 if n.input and n.domain in ("", "ai.onnx") and n.op_type != "Constant"
                 and all(i in self.init_names for i in n.input if i) and self.custom_for(n) is None
                 and not any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute)
                 and all(o in self.floats and self.sizes.get(o, 0) >= FED_MIN for o in n.output)]
        if not found:
            return set()
        nodes = [n for _, n in found]
        names = sorted({i for n in nodes for i in n.input if i})
        inputs = [helper.make_tensor_value_info(i, FLOAT if i in self.fed else self._init_type(i), None)
                  for i in names]
        outputs = [helper.make_tensor_value_info(o, FLOAT, None) for n in nodes for o in n.output]
        model = helper.make_model(helper.make_graph(nodes, "fold", inputs, outputs), ir_version=self.model.ir_version,
                                  opset_imports=list(self.model.opset_import))
        values = Session(model, {}).run({i: self._init_array(i) for i in names})
        self.fed = {**self.fed, **{o.name: np.asarray(v) for o, v in zip(outputs, values, strict=True)}}
        self.init_names |= {o.name for o in outputs}
        return {k for k, _ in found}

    def _init_type(self, name: str) -> int:
        return next(i.data_type for i in self.embedded if i.name == name)

    @property
    def saturation(self) -> float | None:
        """The value reduced results saturate at (None in Inf/NaN mode, or when nothing is reduced)."""
        e = self.emulation
        return LARGEST[e.dtype] if self.overflow == SATURATION and e.reduces != "none" else None

    def reduced(self, node: Any, keep: set[str]) -> bool:
        """Whether the device computes ``node`` in reduced precision under this mode and keep set (a node of
        constants and shapes alone is folded by ATC on the host, in fp32)."""
        e = self.emulation
        if e.reduces == "none" or node.op_type == "Constant":  # constants take their reader's precision
            return False
        if self.custom_for(node) is not None:
            return False  # its own dtypes (_Build.add_custom)
        if e.reduces == "mixed":
            return node.name in self.mixed_reduced(keep)
        if self._excluded(node, keep):
            return False
        return e.reduces == "all" or node.op_type in CUBE_OPS

    @property
    def ascend_types(self) -> dict[str, str]:
        """Node name -> the Ascend IR type ATC gives it (what ``OpType::`` entries and the lists name)."""
        if self._ascend is None:
            from ..atc.ascend_ir import node_types

            self._ascend = node_types(self.model)
        return self._ascend

    def custom_for(self, node: Any) -> Custom | None:
        """The customize_dtypes entry that sets this node's dtypes (under a mode that reduces), or None."""
        entries = self.lists.custom if self.lists is not None else ()
        if not entries or self.emulation.reduces == "none":
            return None
        from ..atc.customize import for_node

        return for_node(list(entries), node.name, self.ascend_types.get(node.name))

    def _excluded(self, node: Any, keep: set[str] | frozenset[str]) -> bool:
        """Kept by keep_dtype (its name, or ``OpType::`` of its Ascend IR type), or folded on the host."""
        if node.name in keep:
            return True
        if any(k.startswith("OpType::") for k in keep) and f"OpType::{self.ascend_types.get(node.name)}" in keep:
            return True
        return bool(node.output) and all(not o or o in self.host for o in node.output)

    def mixed_reduced(self, keep: set[str] | frozenset[str]) -> set[str]:
        """The nodes a mixed mode reduces under ``keep``, in graph order: white reduced, black fp32, gray as the
        producer of its first float input (a graph input, weight or constant is fp32)."""
        key = frozenset(keep)
        if key not in self._mixed:
            from ..atc.mixlists import lists_for

            lists = self.lists or lists_for(None)
            types = self.ascend_types
            reduced_nodes: set[str] = set()
            reduced_values: set[str] = set()
            for node in self.model.graph.node:
                custom = self.custom_for(node)
                if custom is not None:  # its outputs reduced where it names a reduced dtype
                    reduced_values.update(o for o, d in zip(node.output, custom.outputs, strict=False)
                                          if DTYPE_OF.get(d) in ("fp16", "bf16"))
                    continue
                if node.op_type == "Constant" or self._excluded(node, key):
                    continue
                policy = lists.policy(types.get(node.name, node.op_type))
                if policy == "gray":
                    first = next((i for i in node.input if i and i in self.floats), None)
                    policy = "white" if first in reduced_values else "black"
                if policy == "white":
                    reduced_nodes.add(node.name)
                    reduced_values.update(o for o in node.output if o)
            self._mixed[key] = reduced_nodes
        return self._mixed[key]

    def _init_array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name in self.fed:
            return self.fed[name]
        return numpy_helper.to_array(next(i for i in self.embedded if i.name == name))

    def _rounded_init(self, name: str) -> tuple[str, Any]:
        from onnx import numpy_helper

        rname = f"{name}__r{self.emulation.dtype}"
        if name not in self._rounded:
            value = atc_convert(self._init_array(name), self.emulation.dtype)
            self._rounded[name] = value if name in self.fed else numpy_helper.from_array(value, rname)
        return rname, self._rounded[name]

    def needs_conversion(self, name: str) -> bool:
        """Whether a data-movement node must read host value ``name`` converted (a weight in range reads as it is:
        rounding the node's output rounds it alike; a constant past the range saturates on conversion)."""
        if name not in self.init_names:
            return name in self.host
        if name not in self._in_range:
            self._in_range[name] = in_range(self._init_array(name), self.emulation.dtype)
        return not self._in_range[name]

    def build(self, keep: set[str] | frozenset[str] = frozenset(), expose: list[str] | None = None,
              reference: bool = False, only: bool = False, cut: frozenset[str] = frozenset(),
              ) -> tuple[Any, dict[str, np.ndarray]]:
        """The emulated graph (the plain fp32 graph when ``reference``) with the tensors in ``expose``
        added as outputs, and the weights to feed with every run; ``only``: ``expose`` are its only outputs and
        it holds only the nodes they need (onnxruntime runs every node of a graph, whatever a run fetches);
        ``cut`` (with ``only``): values a run feeds, as it fetched them from an earlier run of this graph, in place of
        the nodes that make them (a value a kept node makes anyway is computed, not fed)."""
        from . import int8_device

        build = _Build(self)
        keep = set(keep)
        int8 = None if reference else self.int8
        for k, original in enumerate(self.model.graph.node):
            if k in self.folded:  # its outputs are fed
                continue
            node = type(original)()
            node.CopyFrom(original)
            if int8 is not None and int8.emit(k, node, build):
                continue
            custom = None if reference else self.custom_for(node)
            if custom is not None:
                build.add_custom(node, custom)
            elif reference or not self.reduced(node, keep):
                build.nodes.append(node)
            else:
                build.add_reduced(node)
        nodes = build.nodes
        if int8 is not None:  # the Q/DQ nodes the int8 ops no longer read
            nodes = int8_device.prune(nodes, [o.name for o in self.model.graph.output] + list(expose or []))
        fed: list[str] = []
        if only:
            nodes = needed_nodes(nodes, list(expose or []), cut)
            made = {o for n in nodes for o in n.output}
            fed = sorted({i for n in nodes for i in n.input if i in cut and i not in made})
        return self._assemble(nodes, build.weights, build.extra_inits, expose, only, fed), build.weights

    def _assemble(self, nodes: list[Any], weights: dict[str, np.ndarray], extra_inits: list[Any],
                  expose: list[str] | None, only: bool = False, fed: list[str] | None = None) -> Any:
        """The model of ``nodes``: the weights fed as inputs, ``expose`` added to the outputs (``only``: in place
        of them)."""
        from onnx import helper

        g = self.model.graph
        outputs = [] if only else list(g.output)
        present = {o.name for o in outputs}
        outputs += [helper.make_tensor_value_info(t, FLOAT, None) for t in expose or [] if t not in present]
        inputs = list(self.graph_inputs) + [helper.make_tensor_value_info(n, FLOAT, list(w.shape))
                                            for n, w in weights.items()]
        inputs += [helper.make_tensor_value_info(n, FLOAT, None) for n in fed or []]
        graph = helper.make_graph(nodes, g.name or "g", inputs, outputs, list(self.embedded) + extra_inits)
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        model.functions.extend(self.model.functions)
        return model

    def session(self, keep: set[str] | frozenset[str] = frozenset(), expose: list[str] | None = None,
                reference: bool = False, only: bool = False, cut: frozenset[str] = frozenset()) -> Session:
        model, weights = self.build(keep, expose, reference, only, cut)
        return Session(model, weights)

    def reused_session(self, keep: set[str] | frozenset[str], expose: list[str] | None = None) -> Session:
        """The emulated session of ``keep`` and ``expose``, kept for the next call that asks the same: a dynamic
        graph's device check at each shape point (onnxruntime runs any size within the graph's dynamic dims) runs
        one session, not one built (and warmed up by its first run) per point. Only the last one is kept, dropped
        before another is built, so a keep-set search holds no more sessions than before."""
        key = (frozenset(keep), tuple(expose or ()))
        if self._kept is None or self._kept[0] != key:
            self._kept = None
            self._kept = (key, self.session(keep, expose))
        return self._kept[1]


class _Build:
    """The nodes, weights and rounded copies of one emulated graph as it is built."""

    def __init__(self, emulator: Emulator):
        self.em = emulator
        self.dtype = emulator.emulation.dtype
        self.saturate = emulator.saturation is not None
        self.nodes: list[Any] = []
        self.weights = dict(emulator.fed)
        self.extra_inits: list[Any] = []
        self.rounded: set[str] = set()  # values that already hold what a reduced node reads (representable)
        self.copies: dict[str, str] = {}  # fp32-produced value -> its rounded copy
        self._bounds = False
        self.int8_bounds: tuple[str, str] | None = None  # int8_device's fp16 clip bounds, once added

    def add_reduced(self, node: Any) -> None:
        em = self.em
        skip = SHAPE_INPUTS.get(node.op_type, ())
        moves = em.emulation.rounds_outputs and node.op_type in DATA_MOVEMENT
        for k, name in enumerate(node.input):
            if not name or name not in em.floats or name in self.rounded or k in skip:
                continue
            if not moves or em.needs_conversion(name):
                node.input[k] = self.read_rounded(name)
        self.nodes.append(node)
        if em.emulation.rounds_outputs:
            for k, name in enumerate(node.output):
                if name in em.floats:
                    node.output[k] = f"{name}__fp32"
                    self.nodes.extend(self.pair(node.output[k], name, "o", self.saturate,
                                                self.saturate and node.op_type in NAN_SOURCES))
                    self.rounded.add(name)

    def add_custom(self, node: Any, custom: Custom) -> None:
        """A customize_dtypes node: the inputs and outputs it names in fp16/bf16 are rounded (the emulation's
        reduced dtype), the ones it names float read and write fp32."""
        em = self.em
        skip = SHAPE_INPUTS.get(node.op_type, ())
        for k, name in enumerate(node.input):
            reduced = k < len(custom.inputs) and DTYPE_OF.get(custom.inputs[k]) in ("fp16", "bf16")
            if reduced and name and name in em.floats and name not in self.rounded and k not in skip:
                node.input[k] = self.read_rounded(name)
        self.nodes.append(node)
        for k, name in enumerate(node.output):
            if k < len(custom.outputs) and DTYPE_OF.get(custom.outputs[k]) in ("fp16", "bf16") and name in em.floats:
                node.output[k] = f"{name}__fp32"
                self.nodes.extend(self.pair(node.output[k], name, "o", self.saturate,
                                            self.saturate and node.op_type in NAN_SOURCES))
                self.rounded.add(name)

    def read_rounded(self, name: str) -> str:
        """The copy of ``name`` a reduced node reads: a weight converted once in numpy, a host value (constant
        folded by ATC) saturated, a value computed in fp32 on the device rounded under the overflow mode."""
        if name not in self.copies:
            em = self.em
            if name in em.init_names:
                rname, value = em._rounded_init(name)
                if isinstance(value, np.ndarray):
                    self.weights[rname] = value
                else:
                    self.extra_inits.append(value)
            else:
                rname = f"{name}__in{self.dtype}"
                host = name in em.host
                nan = self.saturate and not host and em.producer_op.get(name) in NAN_SOURCES
                self.nodes.extend(self.pair(name, rname, "h", host or self.saturate, nan))
            self.copies[name] = rname
        return self.copies[name]

    def pair(self, src: str, dst: str, tag: str, clip: bool = False, nan_to_zero: bool = False) -> list[Any]:
        """``src`` rounded to the reduced dtype into ``dst``: Cast(reduced) -> Cast(fp32), after NaN -> 0 and a
        clip to the dtype's range when the value saturates."""
        from onnx import helper

        mid, out = f"{dst}__{tag}", []
        if nan_to_zero:
            self._add_bounds()
            out += [helper.make_node("IsNaN", [src], [f"{mid}_isnan"], name=f"{mid}_isnan"),
                    helper.make_node("Where", [f"{mid}_isnan", "__sat_zero", src], [f"{mid}_nz"], name=f"{mid}_nz")]
            src = f"{mid}_nz"
        if clip:
            self._add_bounds()
            out.append(helper.make_node("Clip", [src, "__sat_lo", "__sat_hi"], [f"{mid}_clip"], name=f"{mid}_clip"))
            src = f"{mid}_clip"
        return out + [helper.make_node("Cast", [src], [mid], to=self.dtype, name=f"{mid}_cast"),
                      helper.make_node("Cast", [mid], [dst], to=FLOAT, name=f"{mid}_back")]

    def _add_bounds(self) -> None:
        from onnx import numpy_helper

        if not self._bounds:
            largest = np.float32(LARGEST[self.dtype])
            self.extra_inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
                                 (("__sat_lo", -largest), ("__sat_hi", largest), ("__sat_zero", 0.0))]
            self._bounds = True


class Session:
    """An onnxruntime session over a built graph, with its weights fed on every run."""

    def __init__(self, model: Any, weights: dict[str, np.ndarray]):
        self.sess = session(model)
        self.weights = weights
        self.inputs = [i.name for i in self.sess.get_inputs() if i.name not in weights]

    def run(self, feed: dict[str, np.ndarray], names: list[str] | None = None) -> list[np.ndarray]:
        return self.sess.run(names, {**{n: feed[n] for n in self.inputs}, **self.weights})


def needed_nodes(nodes: list[Any], roots: list[str], given: frozenset[str] = frozenset()) -> list[Any]:
    """Of ``nodes`` (in graph order), those ``roots`` depend on, values in ``given`` taken as they are (not made).
    A graph with a subgraph (If, Loop, Scan), whose body reads values of the graph around it by name, is kept
    whole."""
    from onnx import AttributeProto

    from .int8_device import prune

    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in nodes for a in n.attribute):
        return nodes
    return prune(nodes, roots, given)


def emulate(model: Any, emulation: Emulation, keep: set[str], overflow: str = INF_NAN, deq_scale: str = "s19",
            lists: MixLists | None = None) -> Any:
    """A self-contained copy of ``model`` (weights embedded) that computes as the device does."""
    from onnx import numpy_helper

    emulator = Emulator(model, emulation.mode, overflow, deq_scale, lists)
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

    from ..graph.onnx_helpers import check_session, session_options

    opts = session_options()  # the device check's sessions live together: none keeps its largest run
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return check_session(model.SerializeToString(), opts)


def run(model: Any, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    sess = session(model)
    names = [i.name for i in sess.get_inputs()]
    return [sess.run(None, {n: feed[n] for n in names}) for feed in feeds]
