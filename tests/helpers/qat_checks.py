"""Independent checks of a QAT export (issue 18): the articles' loop, the written graph re-run in onnxruntime
against the fake-quant torch model, error in units of the output's 8-bit step, and the Q/DQ placement of the
written graph read from its structure (AMCT's rules: docs/research/amct.md, section 1). Nothing here uses the
tool's own metrics or lowering."""
from __future__ import annotations

import collections
import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

COMPUTE = ("Conv", "ConvTranspose", "Gemm", "MatMul")
QDQ = ("QuantizeLinear", "DequantizeLinear")
# what a layer computes beside its Conv/Linear: a lowering that loses one of these changes the model
FUNCTION_OPS = ("Relu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Erf", "Gelu", "Softmax", "Clip",
                "LeakyRelu", "Elu", "PRelu", "Softplus", "Mish", "LayerNormalization", "Conv", "ConvTranspose",
                "Gemm", "MatMul")


def train(case: Any, epochs: int = 1) -> torch.optim.Optimizer:
    """The articles' loop, unchanged: AdamW built before the first forward, ``model.train()``, a few steps."""
    model = case.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for inputs, target in case.batches:
            loss = case.loss_fn(model(**inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return optimizer


def flat(out: Any) -> list[torch.Tensor]:
    """A model's outputs as the export writes them: tensors in order (ModelOutput / tuple / dict flattened)."""
    from .arch_corpus import _flat

    return _flat(out)


def torch_outputs(model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.detach().float().numpy() for t in flat(model(**inputs)) if t.is_floating_point()]


def float_copy(model: nn.Module) -> nn.Module:
    """The trained model without fake quantization: every QuantLayer replaced by the layer it wraps (its
    trained float weight), in eval mode. The int8 graph's distance to it is the accuracy cost of int8."""
    from cann_export.qat.fake_quant import quant_layers
    from cann_export.qat.wrapping import STATE_ATTR

    clone = copy.deepcopy(model)
    for path, layer in quant_layers(clone).items():
        parent, _, attr = path.rpartition(".")
        setattr(clone.get_submodule(parent) if parent else clone, attr, layer.layer)
    clone.__dict__.pop(STATE_ATTR, None)
    return clone.eval()


def run_graph(path: Path, inputs: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """The written graph in onnxruntime as ONNX defines it: basic optimisations only (as a Q/DQ graph's parity
    runs it: the extended level fuses Q/DQ into int8 kernels that saturate on CPUs without VNNI) and without
    onnxruntime's WeightBiasQuantization, a basic-level pass that rounds the float bias of a Conv / Gemm fed by
    Q/DQ to int32 at input scale x weight scale: up to half that step of error per bias (6e-5 relative on a
    torchvision MobileNetV3 squeeze-excite conv), which later rounding points carry on to the output as
    several 8-bit steps."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["WeightBiasQuantization"])
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    return [np.asarray(o, dtype=np.float32) for o in session.run(None, feed)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == nb == 0 else 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def step_metrics(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """``got`` against ``ref`` in units of the reference's 8-bit step (its range / 255): max and RMS error,
    the share of elements within one step, and the cosine."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return {"max_steps": float("inf"), "rms_steps": float("inf"), "within_1_step": 0.0, "cosine": 0.0,
                "step": 0.0, "shape_mismatch": 1.0}
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    step = span / 255 if span > 0 else max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-12) / 127
    err = np.abs(got - ref) / step
    finite = bool(np.isfinite(err).all())
    return {"max_steps": float(err.max()) if finite else float("inf"),
            "rms_steps": float(np.sqrt((err ** 2).mean())) if finite else float("inf"),
            "within_1_step": float((err <= 1.0).mean()), "cosine": cosine(got, ref), "step": step}


def compare(got: list[np.ndarray], ref: list[np.ndarray]) -> list[dict[str, float]]:
    if len(got) != len(ref):
        return [{"max_steps": float("inf"), "rms_steps": float("inf"), "within_1_step": 0.0, "cosine": 0.0,
                 "step": 0.0, "output_count_mismatch": float(len(got) - len(ref))}]
    return [step_metrics(g, r) for g, r in zip(got, ref, strict=True)]


def worst(metrics: list[dict[str, float]]) -> dict[str, float]:
    """The worst output: max / RMS error, within-one-step share and cosine taken over the outputs."""
    return {"max_steps": max(m["max_steps"] for m in metrics), "rms_steps": max(m["rms_steps"] for m in metrics),
            "within_1_step": min(m["within_1_step"] for m in metrics), "cosine": min(m["cosine"] for m in metrics)}


def noise_floor(model: nn.Module, inputs: dict[str, torch.Tensor], draws: int = 2) -> dict[str, Any]:
    """How far the fake-quant model is from itself: in float64 (its fp32 rounding), and in fp32 on its float
    inputs times (1 + 1e-6 noise) (float order flipping an intermediate value at a rounding point, which the
    layers after it carry on). A graph computing the same rounding in another float order can be that far
    from the fp32 reference without being wrong. Per output: the worst of the comparisons."""
    reference = torch_outputs(model, inputs)
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        wide = copy.deepcopy(model).double()
        runs["float64"] = compare(torch_outputs(wide, {k: v.double() if v.is_floating_point() else v
                                                       for k, v in inputs.items()}), reference)
    except RuntimeError:  # an op without a float64 kernel: the perturbed runs only
        pass
    g = torch.Generator().manual_seed(5)
    if any(v.is_floating_point() for v in inputs.values()):
        for d in range(draws):
            noisy = {k: v * (1 + 1e-6 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v
                     for k, v in inputs.items()}
            runs[f"perturbed{d}"] = compare(torch_outputs(model, noisy), reference)
    outputs = [{"rms_steps": max(r[k]["rms_steps"] for r in runs.values()),
                "max_steps": max(r[k]["max_steps"] for r in runs.values()),
                "cosine": min(r[k]["cosine"] for r in runs.values())} for k in range(len(reference))]
    return {"outputs": outputs, "runs": {k: worst(v) for k, v in runs.items()}}


def rounded(value: Any) -> Any:
    """Strict-JSON friendly: floats to 6 significant digits, inf as the string "inf"."""
    if isinstance(value, float):
        return "inf" if value == float("inf") else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def op_counts(graph: Any) -> collections.Counter:
    """What a graph computes, Q/DQ left out: its FUNCTION_OPS (activations, norms, softmax) by type, the number of
    weight elements its Conv / ConvTranspose and Gemm / MatMul ops compute with (the float export may fuse the
    q/k/v Linear layers that read one input into one MatMul; a fake-quantized Linear is written as MatMul + Add,
    its float twin as Gemm), and the number of MatMuls of two activations (attention)."""
    g = graph.graph
    consts = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def weight_elements(name: str) -> int | None:
        for _ in range(3):  # the constant, or the constant behind its Q -> DQ pair (or Transpose)
            if name in consts:
                return int(np.prod(consts[name].dims))
            node = producer.get(name)
            if node is None or node.op_type not in (*QDQ, "Transpose"):
                return None
            name = node.input[0]
        return None

    counts = collections.Counter(n.op_type for n in g.node if n.op_type in FUNCTION_OPS)
    for n in g.node:
        if n.op_type in COMPUTE and len(n.input) > 1:
            size = weight_elements(n.input[1])
            kind = "Conv" if n.op_type.startswith("Conv") else "Gemm|MatMul"
            if size is None:
                counts["MatMul of two activations"] += 1
            else:
                counts[f"{kind} weight elements"] += size
    for k in COMPUTE:
        counts.pop(k, None)
    return counts


def qdq_placement(graph: Any) -> dict[str, Any]:
    """The Q/DQ of a written graph read from its structure: how many compute ops (Conv / ConvTranspose / Gemm /
    MatMul with a constant weight) are quantized (DequantizeLinear on both the activation and the weight), and
    every departure from the contract / AMCT's rules, each as one line naming the node."""
    from onnx import numpy_helper

    g = graph.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = collections.defaultdict(list)
    for n in g.node:
        for i, name in enumerate(n.input):
            consumers[name].append((n, i))
    outputs = {o.name for o in g.output}

    def const(name: str) -> np.ndarray | None:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = producer.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def weight_source(name: str) -> str | None:
        """'qdq' (float init -> Q -> DQ), 'int8' (int8 init -> DQ), 'float' (an initializer) or None."""
        node = producer.get(name)
        if node is None:
            return "float" if const(name) is not None else None
        if node.op_type != "DequantizeLinear":
            return None
        x = node.input[0]
        if const(x) is not None:
            return "int8"
        q = producer.get(x)
        return "qdq" if q is not None and q.op_type == "QuantizeLinear" and const(q.input[0]) is not None else None

    problems: list[str] = []
    quantized, float_compute, forms = [], [], collections.Counter()
    for n in g.node:
        if n.op_type not in COMPUTE or len(n.input) < 2:
            continue
        source = weight_source(n.input[1])
        if source is None:
            continue  # an activation x activation MatMul (attention): not a layer with a weight
        act = producer.get(n.input[0])
        act_dq = act is not None and act.op_type == "DequantizeLinear"
        if source == "float":
            float_compute.append(n.name)
            if act_dq:
                problems.append(f"{n.op_type} {n.name}: activation Q/DQ but a float weight")
            continue
        forms[source] += 1
        if not act_dq:
            problems.append(f"{n.op_type} {n.name}: weight DequantizeLinear but no activation DequantizeLinear")
            continue
        quantized.append(n.name)
        problems += _pair_problems(n, act, producer, const, "activation", per_tensor=True)
        problems += _weight_problems(n, producer[n.input[1]], producer, const)
        if len(n.input) > 2 and n.input[2] and producer.get(n.input[2]) is not None \
                and producer[n.input[2]].op_type in QDQ:
            problems.append(f"{n.op_type} {n.name}: Q/DQ on the bias")
    for n in g.node:
        if n.op_type == "QuantizeLinear":
            bad = [c.op_type for c, _ in consumers[n.output[0]] if c.op_type != "DequantizeLinear"]
            if bad or n.output[0] in outputs:
                problems.append(f"QuantizeLinear {n.name} feeds {bad or 'a graph output'}, not a DequantizeLinear")
        elif n.op_type == "DequantizeLinear":
            for c, i in consumers[n.output[0]]:
                if not ((c.op_type in COMPUTE and i in (0, 1)) or c.op_type == "Add"):
                    problems.append(f"DequantizeLinear {n.name} feeds {c.op_type} {c.name} (input {i}): AMCT adapts "
                                    "Q/DQ only on Conv / ConvTranspose / Gemm / MatMul inputs and Add")
            if n.output[0] in outputs:
                problems.append(f"DequantizeLinear {n.name} is a graph output")
    return {"quantized_compute": len(quantized), "float_compute": float_compute, "weight_forms": dict(forms),
            "problems": problems}


def _pair_problems(node: Any, dq: Any, producer: dict, const: Any, what: str, per_tensor: bool) -> list[str]:
    """An activation DQ: fed by a QuantizeLinear with the same fp32 scalar scale and int8 scalar zero point."""
    where = f"{node.op_type} {node.name} {what}"
    q = producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear":
        return [f"{where}: DequantizeLinear not fed by a QuantizeLinear"]
    problems = []
    qs, ds = const(q.input[1]), const(dq.input[1])
    qz = const(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    dz = const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if qs is None or ds is None or not np.array_equal(qs, ds) or qs.dtype != np.float32:
        problems.append(f"{where}: Q and DQ scales differ or are not fp32 constants")
    elif per_tensor and qs.size != 1:
        problems.append(f"{where}: activation scale has {qs.size} values (per-tensor expected)")
    if qz is None or dz is None or not np.array_equal(qz, dz) or qz.dtype != np.int8:
        problems.append(f"{where}: Q and DQ zero points differ or are not int8 constants")
    return problems


def _weight_problems(node: Any, dq: Any, producer: dict, const: Any) -> list[str]:
    """A weight DQ: symmetric int8 (zero points 0), per output channel only on Conv (axis 0) / ConvTranspose
    (axis 1), per tensor on Gemm / MatMul; values on the int8 grid."""
    where = f"{node.op_type} {node.name} weight"
    scale = const(dq.input[1])
    zero = const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    problems = []
    if zero is None or zero.dtype != np.int8 or np.any(zero != 0):
        problems.append(f"{where}: zero point not int8 zeros")
    if scale is None:
        return [*problems, f"{where}: scale is not a constant"]
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if scale.size > 1:
        allowed = {"Conv": 0, "ConvTranspose": 1}.get(node.op_type)
        if allowed is None:
            problems.append(f"{where}: per-channel ({scale.size}) on {node.op_type}; AMCT takes per-tensor here")
        elif axis != allowed:
            problems.append(f"{where}: per-channel on axis {axis}, expected {allowed}")
    q = producer.get(dq.input[0])
    if q is not None and q.op_type == "QuantizeLinear":
        w, qscale = const(q.input[0]), const(q.input[1])
        if qscale is None or not np.array_equal(qscale, scale):
            problems.append(f"{where}: Q and DQ scales differ")
        elif w is not None:
            shape = [1] * w.ndim
            if scale.size > 1:
                shape[axis] = -1
            grid = w.astype(np.float64) / scale.astype(np.float64).reshape(shape)
            if np.abs(grid - np.rint(grid)).max() > 1e-3 or np.abs(grid).max() > 127.5:
                problems.append(f"{where}: float weight not on the int8 grid of its scale")
    return problems
