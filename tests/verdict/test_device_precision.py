"""Device-precision parity: the sound fp16 emulation (checked against torch fp16 and against a second,
independent emulation in tests/helpers/reference_emulation.py), localisation, and --fix-precision."""
import json
import random

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import calibration_models as cm
from helpers import hf_models
from helpers.reference_emulation import run_device, values
from torch import nn

import cann_export
from cann_export.graph.module_paths import collect
from cann_export.options import Tolerance
from cann_export.validators.fix_precision import device_report, fix_precision
from cann_export.validators.device_verdict import DevicePolicy, judge, topk_agreement
from cann_export.validators.precision import Emulator, emulate, emulation_for, run

FP16_MAX = 65504.0


def Overflowing():
    return cm.ReductionOverflow().eval()


def big_input():
    return cm.reduction_overflow()[1]["x"]


def _onnx(model, inputs, tmp_path):
    inputs = inputs if isinstance(inputs, dict) else (inputs,)
    result = cann_export.export(model, tmp_path / "plain.onnx", "onnx", example_inputs=inputs)
    return onnx.load(result.onnx["path"])


def _feed(graph, inputs):
    inputs = inputs if isinstance(inputs, dict) else {graph.graph.input[0].name: inputs}
    names = [i.name for i in graph.graph.input]
    return {n: v.numpy() for n, v in inputs.items() if n in names}


def _fp32(graph, feed):
    return run(emulate(graph, emulation_for("force_fp32"), set()), [feed])[0]


def _healthy(actual, expected):
    """Device outputs that agree with fp32: finite and cosine >= 0.99 on every output."""
    for a, b in zip(actual, expected, strict=False):
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        if not np.isfinite(a).all():
            return False
        if np.dot(a, b) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30) < 0.99:
            return False
    return True


def _check(graph, feed, keep, fix=False):
    names = [o.name for o in graph.graph.output]
    args = (graph, "force_fp16", list(keep), [feed], [_fp32(graph, feed)], names, Tolerance().device_policy(),
            collect(graph))
    return fix_precision(*args)[0] if fix else device_report(*args)


def test_emulation_matches_torch_fp16_overflow(tmp_path):
    model, x = Overflowing(), big_input()
    graph = _onnx(model, x, tmp_path)
    emulated = run(emulate(graph, emulation_for("force_fp16"), set()), [{"x": x.numpy()}])[0][0]
    with torch.no_grad():
        energy_fp16 = cm.Energy()(model.half().proj(x.half()))
    assert torch.isinf(energy_fp16).all()  # torch fp16 overflows ...
    assert not np.isfinite(emulated).any()  # ... and so does the emulation
    assert np.isfinite(_fp32(graph, {"x": x.numpy()})[0]).all()


def test_emulation_tracks_torch_fp16_on_a_benign_model(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).eval()
    x = torch.randn(8, 64)
    graph = _onnx(model, x, tmp_path)
    feed = [{graph.graph.input[0].name: x.numpy()}]
    emulated = run(emulate(graph, emulation_for("force_fp16"), set()), feed)[0][0]
    with torch.no_grad():
        ref16 = model.half()(x.half()).float().numpy()
        ref32 = model.float()(x).numpy()
    assert np.abs(emulated - ref16).max() < 2e-3  # the emulation sits next to torch fp16 ...
    assert np.abs(emulated - ref32).max() > 1e-5  # ... and visibly off the fp32 result


def _random_keeps(graph, seed):
    names = [n.name for n in graph.graph.node]
    rng = random.Random(seed)
    return [set(), set(names), set(rng.sample(names, len(names) // 2)), set(rng.sample(names, len(names) // 4))]


@pytest.mark.parametrize("build", ["bert", "huge_activations", "exp_overflow", "large_constant"])
def test_emulation_agrees_with_an_independent_emulation(build, tmp_path):
    """The Cast-pair graph in onnxruntime against a node-by-node numpy interpretation of the device rule,
    for no keep_dtype, everything kept and random keep sets."""
    if build == "bert":
        model, inputs = hf_models.tiny_bert(), hf_models.token_inputs()
        inputs["attention_mask"][1, 8:] = 0  # padding: the -3.4e38 mask becomes -inf in fp16
    else:
        model, inputs, _ = getattr(cm, build)()
    graph = _onnx(model, inputs, tmp_path)
    feed = _feed(graph, inputs)
    emulator = Emulator(graph, "force_fp16")
    for keep in _random_keeps(graph, seed=len(build)):
        ours = emulator.session(keep).run(feed)
        theirs = run_device(graph, feed, keep)
        for a, b in zip(ours, theirs, strict=False):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            assert np.array_equal(np.isfinite(a), np.isfinite(b)), keep
            fin = np.isfinite(a)
            scale = max(np.abs(b[fin]).max(initial=0.0), 1.0)
            assert np.abs(a[fin] - b[fin]).max(initial=0.0) <= 4e-3 * scale, keep


class SumSquares(nn.Module):
    def forward(self, h):
        return (h * h).sum(-1, keepdim=True)


class EnergyNet(nn.Module):
    """sqrt(sum of squares): the kept reduction's output, 72,226, is read by the Sqrt."""

    def __init__(self):
        super().__init__()
        self.energy = SumSquares()

    def forward(self, x):
        return torch.sqrt(self.energy(x)) * x


class MeanSquare(nn.Module):
    def forward(self, x):
        return (x * x).mean(-1, keepdim=True) + 1e-6


class RmsNet(nn.Module):
    """RMS normalisation of activations near 510: mean square 2.6e5, read by the Sqrt."""

    def __init__(self):
        super().__init__()
        self.ms = MeanSquare()

    def forward(self, x):
        return x / torch.sqrt(self.ms(x))


class ExpNet(nn.Module):
    """A softmax without max subtraction: exp(14.98) = 3.2e6, read by the ReduceSum and the Div."""

    def forward(self, x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)


def _energy_input():
    v = torch.randn(2, 1300, generator=torch.Generator().manual_seed(0)).abs() + 0.5
    return v / v.norm(dim=-1, keepdim=True) * 72226 ** 0.5


def _rms_input():
    v = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    return v / v.pow(2).mean(-1, keepdim=True).sqrt() * 2.6e5 ** 0.5


def _exp_input():
    v = torch.rand(2, 16, generator=torch.Generator().manual_seed(0)) * 4
    v[:, 0] = 14.98
    return v


@pytest.mark.parametrize("net, make_input, peak", [(EnergyNet, _energy_input, 72226),
                                                   (RmsNet, _rms_input, 2.6e5),
                                                   (ExpNet, _exp_input, 3.2e6)])
def test_fixes_the_old_rule_called_fixed_are_caught_and_really_fixed(net, make_input, peak, tmp_path):
    """The old emulation rounded only fp16 nodes' outputs, so its fix kept exactly the nodes whose own
    output passes 65504 and let their fp16 readers see the fp32 value. Under the device rule those
    readers read inf: both emulations must call that keep set broken, and --fix-precision's keep set
    must be healthy in the independent emulation."""
    x = make_input()
    graph = _onnx(net().eval(), x, tmp_path)
    feed = _feed(graph, x)
    fp32 = values(graph, feed, {n.name for n in graph.graph.node})
    old_keep = {n.name for n in graph.graph.node if any(np.abs(fp32[o]).max() > FP16_MAX for o in n.output)}
    produced = {o for n in graph.graph.node if n.name in old_keep for o in n.output}
    read_in_fp16 = [float(np.abs(fp32[i]).max()) for n in graph.graph.node if n.name not in old_keep
                    for i in n.input if i in produced]
    assert max(read_in_fp16) == pytest.approx(peak, rel=0.02)  # what an fp16 node reads from a kept one
    reference = _fp32(graph, feed)
    assert not _healthy(run_device(graph, feed, old_keep), reference)  # the device breaks ...
    assert not _check(graph, feed, old_keep)["passed"]  # ... and the verdict says so

    report = _check(graph, feed, [], fix=True)
    fix = report["precision"]["fix"]
    assert report["passed"] and fix["fixed"] and "reason" not in fix
    assert set(fix["kept"]) > old_keep  # the readers of the big values are kept too
    assert _healthy(run_device(graph, feed, set(fix["kept"])), reference)  # and the device agrees


class Offset(nn.Module):
    def forward(self, x):
        return (x + 1e6) * 1e-6


class OffsetNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = Offset()

    def forward(self, x):
        return self.offset(x) * x


def test_a_kept_node_keeps_its_fp32_constant(tmp_path):
    """1e6 is inf in fp16: a kept node must read it as 1e6, an fp16 node as inf."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    graph = _onnx(OffsetNet().eval(), x, tmp_path)
    feed = _feed(graph, x)
    offset_nodes = {n for n, p in collect(graph).items() if p == "offset"}
    assert offset_nodes
    assert not _check(graph, feed, [])["passed"]
    emulator = Emulator(graph, "force_fp16")
    kept = emulator.session(offset_nodes).run(feed)[0]
    assert np.isfinite(kept).all() and _healthy([kept], _fp32(graph, feed))
    assert np.isfinite(run_device(graph, feed, offset_nodes)[0]).all()
    report = _check(graph, feed, [], fix=True)
    assert report["passed"] and set(report["precision"]["fix"]["kept"]) == offset_nodes


class Chain(nn.Module):
    """Four steps that all hold values past fp16's range."""

    def forward(self, x):
        s = (x * x).sum(-1, keepdim=True)
        return torch.sqrt(((s * 3.0 + 5.0) / 3.0) - 1.0)


class ChainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.chain = Chain()

    def forward(self, x):
        return self.chain(x) * x


def test_fix_keeps_a_whole_module_when_one_node_is_not_enough(tmp_path):
    x = _energy_input() * 3
    graph = _onnx(ChainNet().eval(), x, tmp_path)
    feed = _feed(graph, x)
    report = _check(graph, feed, [], fix=True)
    fix = report["precision"]["fix"]
    chain = {n for n, p in collect(graph).items() if p == "chain"}
    assert report["passed"] and len(fix["rounds"]) == 2 and fix["rounds"][1]["module"] == "chain"
    assert set(fix["rounds"][0]["kept"]) | set(fix["rounds"][1]["kept"]) == chain  # grown to the module ...
    assert set(fix["kept"]) <= chain and fix["kept_ops"] == len(fix["kept"])  # ... then shrunk by bisection
    assert _healthy(run_device(graph, feed, set(fix["kept"])), _fp32(graph, feed))


class Ladder(nn.Module):
    """Twenty root-level steps, each through 9e4 and back: every one needs two nodes in fp32."""

    def forward(self, x):
        for _ in range(20):
            x = (x * 300.0) / 299.0
        return x


def test_fix_lands_when_growing_from_the_origin_runs_out_of_rounds(tmp_path):
    """16 rounds keep 16 of the 40 nodes; the fix then keeps every node and bisects: all 40 are needed."""
    x = torch.full((1, 4), 300.0)
    path = tmp_path / "ladder.pt2"
    torch.export.save(torch.export.export(Ladder().eval(), (x,)), str(path))
    from cann_export.cli.main import cli

    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o"), "--fix-precision", "--json"])
    assert result.exit_code == 0, result.output
    fix = json.loads(result.stdout)["parity"]["precision"]["fix"]
    assert fix["fixed"] and fix["rounds"][-1]["kept"] == "every node" and "16 rounds" in fix["rounds"][-1]["because"]
    graph = onnx.load(str(tmp_path / "o" / "model.onnx"))
    keep = set((tmp_path / "o" / "atc" / "keep_dtype.cfg").read_text().split())
    assert fix["kept_ops"] == len(keep) == 40 and fix["kept_flops_share"] == 1.0
    assert _healthy(run_device(graph, {graph.graph.input[0].name: x.numpy()}, keep), _fp32(graph, {
        graph.graph.input[0].name: x.numpy()}))


def test_overflow_fails_under_force_fp16_and_names_the_module(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),))
    parity = result.parity
    assert not result.ok and parity["graph_fp32_passed"] is True
    assert parity["precision"]["mode"] == "force_fp16"
    first = parity["first_divergence"]
    assert first["module"] == "energy" and first["overflow"]
    assert first["message"].startswith("first divergence: energy (")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["parity"]["first_divergence"]["module"] == "energy"
    json.loads((tmp_path / "b" / "parity.json").read_text(), parse_constant=pytest.fail)  # strict JSON


def test_overflow_passes_under_must_keep_origin_dtype(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),),
                                precision_mode="must_keep_origin_dtype")
    assert result.ok and result.parity["precision"]["emulated"].startswith("none")


def test_fix_precision_keeps_the_offending_nodes(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),), fix_precision=True)
    assert result.ok, result.parity
    kept = result.parity["fixed_by_keep_dtype"]
    assert kept and result.parity["precision"]["fix"]["fixed"]
    cfg = (tmp_path / "b" / "atc" / "keep_dtype.cfg").read_text().split()
    from cann_export.atc.ascend_ir import node_types

    types = node_types(onnx.load(str(result.onnx["path"])))
    assert all(n in cfg or f"OpType::{types[n]}" in cfg for n in kept), (kept, cfg)  # by name or by Ascend IR type
    assert "--keep_dtype=atc/keep_dtype.cfg" in (tmp_path / "b" / "atc" / "convert.sh").read_text()
    assert result.manifest["atc"]["keep_dtype"]["nodes"] == cfg
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))  # the written bundle, under the device rule
    feed = {"x": big_input().numpy()}
    kept_nodes = {n for n, t in node_types(graph).items() if n in cfg or f"OpType::{t}" in cfg}
    assert _healthy(run_device(graph, feed, kept_nodes), _fp32(graph, feed))


def test_keeping_one_module_is_not_enough_when_an_fp16_node_reads_its_output(tmp_path):
    """energy's 4.1e5 stays fp32 in the kept module, but the Sqrt after it reads it in fp16: inf."""
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),),
                                atc_hints={"keep_dtype": ["energy"]}, soc_version="Ascend910B1")  # IEEE: inf
    assert not result.ok
    first = result.parity["first_divergence"]
    assert first["op_type"] == "Sqrt" and first["overflow"] and first["module"] == ""
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))
    keep = set((tmp_path / "b" / "atc" / "keep_dtype.cfg").read_text().split())
    assert not np.isfinite(run_device(graph, {"x": big_input().numpy()}, keep)[0]).any()


@pytest.mark.parametrize("mode", ["allow_mix_precision", "cube_fp16in_fp32out", "allow_fp32_to_bf16"])
def test_other_modes_are_emulated_and_reported(mode, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    result = cann_export.export(model, tmp_path / "b", example_inputs=torch.randn(2, 16), precision_mode=mode)
    assert result.ok and result.parity["precision"]["mode"] == mode


def test_cube_modes_round_only_what_reaches_a_cube_op(tmp_path):
    """allow_fp32_to_fp16 keeps the sum of squares in fp32 (no overflow); force_fp16 does not."""
    graph = _onnx(Overflowing(), big_input(), tmp_path)
    feed = {"x": big_input().numpy()}
    cube = Emulator(graph, "allow_fp32_to_fp16").session().run(feed)[0]
    assert np.isfinite(cube).all()
    assert not np.isfinite(Emulator(graph, "force_fp16").session().run(feed)[0]).any()


def test_policy_noise_floor_fail_cosine_and_topk():
    policy = DevicePolicy()
    eps = 2.0 ** -10
    ref = np.full(1000, 0.5, np.float32) + np.linspace(0, 6e-4, 1000, dtype=np.float32)  # DETR-like boxes
    noisy = ref + np.float32(2e-4) * np.sign(np.sin(np.arange(1000)))
    assert judge(noisy, ref, policy, eps)["passed"]  # an old-style range rule (1% of 6e-4) fails this
    small = np.random.default_rng(0).normal(size=1000).astype(np.float32) * 1e-4
    flipped = -small
    low = judge(flipped, small, policy, eps)
    assert not low["passed"] and "cosine" in low["reason"]  # tiny but wrong: cosine < 0.9 always fails
    wobble = small + np.random.default_rng(1).normal(size=1000).astype(np.float32) * 3e-5
    assert judge(wobble, small, policy, eps)["passed"]  # cosine < 0.99, error under the floor (msit)
    big = small * 1e4
    assert not judge(wobble * 1e4, big, policy, eps)["passed"]  # the same cosine at scale fails
    inf = judge(np.array([1.0, np.inf], np.float32), np.array([1.0, 7e4], np.float32), policy, eps)
    assert not inf["passed"] and inf["non_finite"] and json.dumps(inf, allow_nan=False)
    logits = np.array([[0.1, 0.9, 0.3, 0.2, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0, -2.0, -3.0]], np.float32)
    swapped = logits[:, [1, 0, 2, 3, 4, 5]]
    assert topk_agreement(swapped, logits) == {"top1_agreement": 0.0, "top5_agreement": 1.0}


def test_cli_prints_the_first_divergence(tmp_path):
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Overflowing(), (big_input(),)), str(path))
    from cann_export.cli.main import cli

    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "first divergence: energy" in result.stdout and "fp16 overflow" in result.stdout


def test_validate_reruns_device_precision(tmp_path):
    from cann_export.cli.main import cli

    cann_export.export(Overflowing(), tmp_path / "fixed", example_inputs=(big_input(),), fix_precision=True)
    cann_export.export(Overflowing(), tmp_path / "broken", example_inputs=(big_input(),))
    ok = CliRunner().invoke(cli, ["validate", str(tmp_path / "fixed"), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["parity"]["precision"]["mode"] == "force_fp16"
    bad = CliRunner().invoke(cli, ["validate", str(tmp_path / "broken"), "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["parity"]["first_divergence"]["module"] == "energy"
