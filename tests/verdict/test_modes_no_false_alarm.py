"""The device verdict under every precision mode ATC accepts and both overflow modes (issue 45's numbers): no false
alarm on the healthy corpus (helpers/calibration_models.HEALTHY, the healthy models of helpers/overflow_models), and
the sick models of helpers/overflow_models caught under each mode that computes the overflowing op in fp16.

Each graph is exported once (module scope); the verdict is the export's own (parity.with_device_parity, with the
SoC's lists and overflow mode), on the example, against the module's fp32 outputs. The SoCs cover every list family
(atc/mixlists.family) and both overflow modes (options.soc_model). Which modes break a sick model is written here
from the models' arithmetic, not from the tool's reduction rule."""
import numpy as np
import onnx
import pytest
import torch
from helpers import calibration_models as cm
from helpers import overflow_models as om

import cann_export
from cann_export.atc.command import PRECISION_MODES_V2
from cann_export.inputs.tensors import flatten_outputs
from cann_export.options import PRECISION_MODES, Tolerance, soc_model
from cann_export.validators.parity import with_device_parity

MODES = tuple(dict.fromkeys(PRECISION_MODES + PRECISION_MODES_V2))
SOCS = {"Ascend310P3": "saturation", "Ascend310": "saturation", "Ascend910B1": "inf_nan",
        "Ascend910_9391": "inf_nan"}
FP32_KEEPING = ("force_fp32", "must_keep_origin_dtype", "origin")
BF16 = ("allow_mix_precision_bf16", "allow_fp32_to_bf16", "mixed_bfloat16")  # bf16's range: nothing overflows
CUBE_ONLY = ("allow_fp32_to_fp16", "cube_fp16in_fp32out")  # the overflowing Mul is not a cube op: fp32
FP16_EVERY = ("force_fp16", "fp16")  # every op in fp16
MIXED = ("allow_mix_precision", "allow_mix_precision_fp16", "mixed_float16", "mixed_hif8", "allow_mix_precision_bf16",
         "allow_fp32_to_bf16", "mixed_bfloat16")
# alarms that are true, not false: DeBERTa fills masked scores with float32 min (-3.4e38) in Where(~mask, fill,
# scores); its first float input is the fill, a constant, so the gray Where keeps fp32 (the graph engine matches a
# gray op's inputs to their producers' dtypes in order: hicann/ge, RunForOpInGrayList in
# op_dtype_selection_strategy_allow_mix_precision_base.cc), and on the 910B lists SoftmaxV2 is white: the device
# casts -3.4e38 at run time, to -inf in fp16 and in bf16 (past their largest values, round to nearest); a padded
# query's row, masked whole, is then NaN and spreads through the next layer (0 x NaN). Real fp16 in torch fills
# with fp16's min instead, so it cannot show this.
TRUE_ALARMS = {("tiny_deberta", "Ascend910B1"): MIXED}
SLOW = {"resnet50_like", "convnext", "efficientnet", "mobilenet_v2", "detr", "tiny_deberta"}


def _linear_softmax():
    return om.LinearSoftmax().eval(), {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(1))}


def _softmax_inputs():
    return {"x": om.scaled_softmax_inputs()}


HEALTHY = {**cm.HEALTHY, "linear_softmax": _linear_softmax,
           "masked_attention": lambda: (om.MaskedAttention().eval(), om.masked_attention_inputs()),
           "tiny_deberta": om.tiny_deberta}
# sick: (builder, the (mode, overflow) pairs whose device breaks it)
SICK = {
    # (x * 400) * 400 = 1.6e5 per unit of x: past 65504 where the last Mul writes fp16 (a saturated 65504 is as
    # wrong as inf); the Muls are gray ops fed by the graph input, so the mixed lists keep them fp32
    "saturating": (lambda: (om.Saturating().eval(), {"x": torch.randn(4, 8, generator=torch.Generator()
                                                                    .manual_seed(0))}),
                   lambda mode, overflow: mode in FP16_EVERY),
    # logits past 65504 from the Mul after the MatMul (white: the gray Mul follows it in the fp16 mixed modes):
    # inf then NaN through the softmax in inf_nan; saturated logits keep the one-hot softmax of fp32
    # (tests/verdict/test_soc_overflow.py), so a saturating SoC is right
    "scaled_softmax": (lambda: (om.ScaledSoftmax().eval(), _softmax_inputs()),
                       lambda mode, overflow: overflow == "inf_nan" and mode not in FP32_KEEPING + BF16 + CUBE_ONLY),
}


def _params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(names)]


def _graph(builder, tmp_path_factory):
    model, inputs = builder()
    target = tmp_path_factory.mktemp("modes") / "model.onnx"
    graph = onnx.load(cann_export.export(model, target, "onnx", example_inputs=inputs).onnx["path"])
    names = {i.name for i in graph.graph.input}
    feed = {n: v.numpy() for n, v in inputs.items() if n in names}
    with torch.no_grad():
        expected = [t.numpy() for t in flatten_outputs(model(**inputs))[1]]
    assert len(expected) == len(graph.graph.output)
    return graph, feed, expected


def verdict(graph, feed, expected, mode, soc):
    """The export's device verdict for one mode and SoC: passed, and the reasons of the outputs that failed."""
    names = [o.name for o in graph.graph.output]
    fp32 = {"passed": True, "outputs": [{"name": n, "passed": True} for n in names], "tolerance": {}}
    report = with_device_parity(fp32, graph, mode, [], [feed], [expected], Tolerance(), {}, soc=soc)
    failed = [f"{o['name']}: {o.get('reason')}" for o in report["outputs"] if not o.get("passed", True)]
    return bool(report["passed"]), failed


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(name, builder):
        if name not in cache:
            cache[name] = _graph(builder, tmp_path_factory)
        return cache[name]
    return get


def test_the_socs_cover_both_overflow_modes_and_every_list_family():
    from cann_export.atc.mixlists import data, family

    assert {soc: soc_model(soc).overflow for soc in SOCS} == SOCS
    assert {family(s) for s in SOCS} == set(data()["families"])
    assert {"force_fp16", "allow_mix_precision", "mixed_float16", "mixed_bfloat16", "mixed_hif8"} <= set(MODES)


@pytest.mark.parametrize("soc", SOCS)
@pytest.mark.parametrize("name", _params(HEALTHY))
def test_a_healthy_model_passes_under_every_mode(name, soc, exported):
    graph, feed, expected = exported(name, HEALTHY[name])
    alarms = {mode: why for mode in MODES if not (why := verdict(graph, feed, expected, mode, soc))[0]}
    assert set(alarms) == set(TRUE_ALARMS.get((name, soc), ())), alarms
    assert all(why == [f"{o.name}: overflow: inf/nan where the fp32 reference is finite" for o in graph.graph.output]
               for _, why in alarms.values()), alarms


def test_a_fill_of_float32_min_cast_at_run_time_makes_a_masked_row_nan():
    """The arithmetic behind TRUE_ALARMS, in numpy and torch: the fill past fp16's and bf16's range is -inf once
    cast on the device, and a softmax over a row of -inf is NaN; converted on the host (a reduced Where's constant)
    it is -65504 and the row is uniform."""
    fill = np.full(4, np.finfo(np.float32).min, np.float32)
    for dtype in (torch.float16, torch.bfloat16):
        row = torch.from_numpy(fill).to(dtype).float()
        assert torch.isneginf(row).all() and torch.isnan(torch.softmax(row, -1)).all()
    host = torch.from_numpy(fill).clamp(-om.FP16_MAX, om.FP16_MAX).half().float()
    assert torch.allclose(torch.softmax(host, -1), torch.full((4,), 0.25))


@pytest.mark.parametrize("soc", SOCS)
@pytest.mark.parametrize("name", sorted(SICK))
def test_a_sick_model_is_caught_under_each_mode_that_breaks_it(name, soc, exported):
    builder, breaks = SICK[name]
    graph, feed, expected = exported(name, builder)
    overflow = SOCS[soc]
    got = {mode: verdict(graph, feed, expected, mode, soc)[0] for mode in MODES}
    wanted = {mode: not breaks(mode, overflow) for mode in MODES}
    assert got == wanted
    assert np.isfinite(expected[0]).all()  # the fp32 reference itself is sound
