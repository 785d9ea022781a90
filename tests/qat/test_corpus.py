"""Issue 18's QAT corpus: the articles' unchanged QAT loop (``cann.torch.config(quantization_aware_training=True,
quant_config=...)``, AdamW built before the first forward, a few steps in train mode, ``model.eval()``,
``cann.torch.export(..., export_format="atc_ready")`` with default options) on each real architecture of
tests/helpers/qat_corpus.py. Per architecture:

- the tool's parity passes (``result.ok``);
- independently, the written graph in onnxruntime (basic optimisations, as a Q/DQ graph's parity runs it)
  matches the fake-quant torch model (a copy taken before the export) on a fresh input, in units of each
  output's 8-bit step (range / 255): cosine >= 0.9999 and >= 98 % of the elements within one step, or no
  further than twice the fake-quant model's own noise (itself in float64, and on inputs perturbed by 1e-6:
  a deep int8 network carries a rounding flip of one intermediate value on to its output, see
  qat_checks.noise_floor); in models with fused norm+activation blocks the same check rejects the activations
  dropped (issue 18's bug), so it can fail here;
- the export leaves the user's model as it was (its outputs on the fresh input unchanged);
- the Q/DQ placement, read from the graph's structure: as many quantized compute ops (Conv / ConvTranspose /
  Gemm / MatMul with DequantizeLinear on the activation and the constant weight) as the model has quantized
  layers, no compute op with a constant weight left in float, weights in the contract's float -> Q -> DQ form,
  and no departure from AMCT's rules (qat_checks.qdq_placement);
- the graph computes what the float model does: its activations, norms and compute ops counted as in the
  float model's own export.

- the tool's own int8 policy, re-run from what the bundle stores, rejects the same norm-act bug, and
  ``cann_export.validate`` re-derives the export's verdict from the bundle (the reference's rounding noise and
  the float model's outputs, which the int8 device verdict measures against, travel in parity/).

Every failed check of an architecture is reported together. One test per architecture, so xdist spreads them;
each trains and exports twice (QAT and float) in a few seconds. The corpus holds timm and torchvision models: it
runs in the vision environment (tests/vision_env.sh), with the other vision corpora."""
import pytest
import torch
from helpers import qat_broken, qat_policy_check
from helpers import qat_checks as qc
from helpers import qat_flow
from helpers.qat_corpus import CORPUS

pytestmark = pytest.mark.vision

MIN_COSINE, MIN_WITHIN_1_STEP, FLOOR_FACTOR = 0.9999, 0.98, 2.0


def passes(metrics, floor=None):
    """The independent verdict on one input, per output: within the step rule, or no further from the reference
    than ``FLOOR_FACTOR`` x the fake-quant model's own noise (qat_checks.noise_floor)."""
    def ok(m, f):
        if m["cosine"] >= MIN_COSINE and m["within_1_step"] >= MIN_WITHIN_1_STEP:
            return True
        return f is not None and f["rms_steps"] > 0 and m["rms_steps"] <= FLOOR_FACTOR * f["rms_steps"] \
            and 1 - m["cosine"] <= FLOOR_FACTOR * (1 - f["cosine"])
    floors = floor["outputs"] if floor else [None] * len(metrics)
    return len(floors) == len(metrics) and all(ok(m, f) for m, f in zip(metrics, floors, strict=True))


def _fmt(metrics):
    return "; ".join(f"output {k}: max {m['max_steps']:.3g} steps, rms {m['rms_steps']:.3g}, "
                     f"{100 * m['within_1_step']:.1f}% within 1 step, cosine {m['cosine']:.6f}"
                     for k, m in enumerate(metrics))


def _checks(flow):
    """Every failed check of one architecture, as lines."""
    import onnx

    from cann_export.qat.fake_quant import quant_layers

    failures = []
    if not flow.result.ok:
        failures.append(f"the tool's parity fails: {flow.result.parity.get('reason')}")
    if flow.changed_by_export > 0:
        failures.append(f"the export changed the user's model: its outputs moved by up to {flow.changed_by_export:.3g}")
    fresh = flow.case.inputs(qat_flow.FRESH_SEED)
    reference = qc.torch_outputs(flow.model, fresh)
    floor = qc.noise_floor(flow.model, fresh)
    metrics = qc.compare(qc.run_graph(flow.graph_path, fresh), reference)
    if not passes(metrics, floor):
        failures.append(f"onnxruntime vs the fake-quant model on a fresh input: {_fmt(metrics)} (the model's own "
                        f"noise: {[qc.rounded(f) for f in floor['outputs']]})")
    graph = onnx.load(str(flow.graph_path))
    placement = qc.qdq_placement(graph)
    layers = len(quant_layers(flow.model))
    if placement["quantized_compute"] != layers:
        failures.append(f"{placement['quantized_compute']} quantized compute ops for {layers} quantized layers")
    if placement["float_compute"]:
        failures.append(f"{len(placement['float_compute'])} compute op(s) with a constant weight left in float "
                        f"(layers the QAT did not quantize): {placement['float_compute'][:6]}")
    forms = placement["weight_forms"]
    if set(forms) - {"qdq"}:
        failures.append(f"weights not in the float -> QuantizeLinear -> DequantizeLinear form: {forms}")
    if placement["problems"]:
        failures.append(f"{len(placement['problems'])} Q/DQ placement problem(s), e.g. {placement['problems'][:4]}")
    mine, float_ops = qc.op_counts(graph), qc.op_counts(flow.float_graph)
    differ = {k: (mine[k], float_ops[k]) for k in sorted(set(mine) | set(float_ops)) if mine[k] != float_ops[k]}
    if differ:
        failures.append(f"ops differ from the float model's export (int8, float): {differ}")
    # the independent check can fail: it rejects issue 18's bug (a norm-act layer folded without its activation)
    broken = qat_broken.norm_act_dropped(flow.model)
    if broken is not None and passes(qc.compare(qc.torch_outputs(broken[0].eval(), fresh), reference), floor):
        failures.append(f"the independent check does not reject norm-act layers without their activation ({broken[1]})")
    # the tool's own int8 policy, from what the bundle stores (as `cann-export validate` runs it), rejects it too
    if broken is not None:
        data = qat_policy_check.stored(flow.qat_dir)
        actual = [qc.torch_outputs(broken[0].eval(), {n: torch.from_numpy(v) for n, v in feed.items()})
                  for feed in data["feeds"]]
        if qat_policy_check.outputs_verdict(actual, data):
            failures.append(f"the tool's int8 parity passes norm-act layers without their activation ({broken[1]})")
    import cann_export

    revalidated = cann_export.validate(flow.qat_dir)  # raises on any difference from what the export recorded
    if revalidated["passed"] != flow.result.ok:
        failures.append(f"cann_export.validate re-derives passed={revalidated['passed']}, the export {flow.result.ok}")
    return failures


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a 2-core machine with two xdist workers, two OpenMP threads per process wait a
    scheduler slice (about 8 ms) at every parallel op (x * 2 on 131k floats: 8 ms against 0.45 ms measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(CORPUS))
def test_articles_qat_loop_exports_int8(name, tmp_path):
    flow = qat_flow.run(name, tmp_path)
    if flow.error:
        pytest.fail(f"{name}: the QAT export raised {flow.error}")
    failures = _checks(flow)
    assert not failures, f"{name}:\n  " + "\n  ".join(failures)
