"""Parity's shape budget counts every intermediate (inputs/activations.py, inputs/parity_budget.py): a set whose
inputs and outputs are small but whose attention scores are not is left out, the estimate grows an attention
score with the square of the sequence, the budget's floor is the example's own intermediates, validate refuses
an edited estimate, and the checks' own cost is on its own line and in the manifest (validators/cost.py)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from cann_export.inputs import parity_budget as budget
from cann_export.bundle.graph_shapes import shape_sets
from cann_export.hf.graph_plans import plan_for
from cann_export.inputs.activations import largest, op_sizes, recorded_terms, terms_of
from cann_export.validators.cost import checks_line, checks_record

POSITIONS, HEADS = 384, 4  # the encoder's window: 768 frames in, 384 positions, scores 4 x 384 x 384 per row


def _whisper_encoder_plan():
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=96, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=POSITIONS,
                                     max_target_positions=32, pad_token_id=1, bos_token_id=1, eos_token_id=2,
                                     decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None)
    plan = plan_for(transformers.WhisperForConditionalGeneration(cfg).eval(), "automatic-speech-recognition")
    return plan, next(c for c in plan.components if c.name == "encoder")


def test_a_long_window_encoders_batch_is_bounded_by_its_attention_scores():
    """Its inputs and outputs at batch 64 are 1.2 M elements, far under the 2^24 floor; its attention scores there
    are 38 M (x2 alive): the batch range's end is left out, recorded with the reason, and every kept set's scores
    fit the budget."""
    plan, encoder = _whisper_encoder_plan()
    example, sets, notes, record = shape_sets(plan, encoder, None)(0)
    points = [p for p, _ in sets]
    limit = record["elements"]
    assert record["full"] is False and limit == budget.FLOOR
    assert any(t["exponents"] == {"batch_size": 1} and t["elements"] >= example["batch_size"] * HEADS * POSITIONS ** 2
               for t in record["activations"]), record["activations"]
    batches = sorted(p["batch_size"] for p in points)
    assert batches[0] == 1 and 1 < batches[-1] < 64, batches
    for batch in batches:
        assert budget.LIVE * batch * HEADS * POSITIONS ** 2 <= limit
    assert budget.LIVE * (batches[-1] + 2) * HEADS * POSITIONS ** 2 > limit  # about the largest batch within it
    assert ("batch_size", 64) in {(g["dimension"], g["size"]) for g in record["left_out"]}
    assert any("batch_size=64" in n and "--parity-full-ranges" in n for n in notes)


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = self.proj(x)
        scores = torch.softmax(q @ q.transpose(-1, -2), dim=-1)
        return scores @ q


def test_the_estimate_grows_scores_with_the_square_of_the_sequence_and_rows_linearly():
    module = _Attention()
    runs = {}
    for batch, seq in ((2, 16), (1, 16), (2, 8)):
        with torch.no_grad(), op_sizes() as ops:
            module(torch.randn(batch, seq, 8))
        runs[(batch, seq)] = ops
    example = {"batch": 2, "seq": 16}
    terms = terms_of(example, runs[(2, 16)], {"batch": (1, runs[(1, 16)]), "seq": (8, runs[(2, 8)])})
    assert {"elements": 2 * 16 * 16, "exponents": {"batch": 1, "seq": 2}} in terms
    assert largest(terms, example, {"batch": 4, "seq": 64}) == 4 * 64 * 64
    assert largest(terms, example, example) == 2 * 16 * 16
    assert recorded_terms(terms) == terms


def test_a_fused_attention_counts_the_scores_the_graph_will_hold():
    """Eager's flash kernel never holds the scores; onnxruntime's MatMul + Softmax does: the op counts them."""
    q = torch.randn(1, 2, 100, 8)
    with torch.no_grad(), op_sizes() as ops:
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert max(n for _, n in ops) >= 2 * 100 * 100


@pytest.mark.parametrize("terms", [
    [{"elements": 1, "exponents": {"b": 9}}], [{"elements": -1, "exponents": {}}],
    [{"elements": True, "exponents": {}}], [{"elements": 1, "exponents": {}, "x": 1}], "x",
    [{"elements": 1, "exponents": {}}] * 17])
def test_an_edited_estimate_is_refused(terms):
    assert recorded_terms(terms) is None
    record = {"full": False, "weights": 300, "elements": budget.FLOOR, "activations": terms}
    found, problem = budget.recorded_budget(record, lambda: 1)
    assert found is None and "activation terms" in problem


def test_the_floor_is_the_examples_own_set():
    terms = [{"elements": 1 << 26, "exponents": {"b": 1}}]
    record = {"full": False, "weights": 300, "elements": budget.FLOOR, "activations": terms}
    assert "is not the budget of" in budget.recorded_budget(record, lambda: 1 << 27)[1]
    assert budget.recorded_budget(record, lambda: 5) == (budget.FLOOR, None)
    record["elements"] = 1 << 27
    assert budget.recorded_budget(record, lambda: 1 << 27) == (1 << 27, None)


def test_the_checks_cost_is_the_growth_of_the_peak_in_their_stages():
    seconds = {"load": 1.0, "prepare": 2.0, "capture": 5.0, "validate": 3.0}
    peaks = {"load": 400.0, "prepare": 700.0, "capture": 750.0, "validate": 900.0}
    assert checks_record(seconds, peaks) == {"seconds": 5.0, "peak_mib": 900.0, "added_mib": 450.0}
    assert checks_record(seconds, {"load": 400.0}) is None
    assert "raised the peak RSS by 450 MiB, to 900 MiB" in checks_line(checks_record(seconds, peaks))
    assert checks_line({"seconds": "x"}) is None


def test_the_cli_prints_the_checks_cost_and_the_manifest_keeps_it(tmp_path):
    from click.testing import CliRunner

    from cann_export.cli.main import cli

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    src = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), str(src))
    out = tmp_path / "bundle"
    r = CliRunner().invoke(cli, [str(src), "--format", "onnx_bundle", "-o", str(out), "--no-sandbox"])
    assert r.exit_code == 0, r.output
    line = next(line for line in r.output.splitlines() if line.startswith("checks: "))
    record = json.loads((out / "manifest.json").read_text())["parity"]["checks"]
    assert record["peak_mib"] >= record["added_mib"] >= 0 and record["seconds"] > 0
    assert f"to {record['peak_mib']:.0f} MiB" in line


def test_checks_sessions_keep_no_run_between_runs(tmp_path):
    """Each onnxruntime session the checks open (parity, the device emulation, a large graph's) hands a run's
    memory back when the run ends: with the arena kept every live session held its largest run (three sessions of a
    Whisper-tiny-sized encoder at its real window: 372 MiB against 173); without an arena each intermediate was a
    malloc of its own that glibc kept (ViT-small at batch 16: +529 MiB against +80, and more page faults)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from cann_export.capture.large_graph import session as large_session
    from cann_export.graph.onnx_helpers import session
    from cann_export.validators import precision
    from cann_export.validators.parity import onnx_session

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Expand", ["r", "shape"], ["big"]),
             helper.make_node("ReduceSum", ["big"], ["y"])]  # (the arena's first region, a run's first tensor, stays)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1])],
                              [helper.make_tensor("shape", TensorProto.INT64, [3], [64, 1024, 1024])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    opened = [onnx_session(path, [{"x": None}])[0], precision.session(model), session(path), large_session(path)]
    assert all(s.get_session_options().enable_cpu_mem_arena for s in opened)

    def rss_mib() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

    before = rss_mib()
    for s in opened:  # each run makes a 256 MiB intermediate
        assert s.run(None, {"x": np.ones(1, np.float32)})[0].item() == 64 * 1024 * 1024
    assert rss_mib() - before < 200, (before, rss_mib())  # four sessions that kept their run: 1 GiB


def test_a_dynamic_graphs_per_layer_values_are_fetched_in_runs_sized_at_the_feed(monkeypatch):
    """The per-layer curve's exposure runs stay within origin.BUDGET at the feed's real sizes: a dynamic graph's
    values have no static size, and counted as the largest static one (here none) they all went into one run."""
    import numpy as np
    from onnx import TensorProto, helper

    from cann_export.validators import origin
    from cann_export.validators.precision import Emulator

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1000])])
    emulator = Emulator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "force_fp16")
    monkeypatch.setattr(origin, "BUDGET", 15000)  # one value of 10 x 1000 per run
    runs = []
    opened = emulator.session
    monkeypatch.setattr(emulator, "session", lambda *a, **k: runs.append(k.get("expose")) or opened(*a, **k))
    feed = {"x": np.ones((10, 1000), dtype=np.float32)}
    values = [t for t, _, _ in origin.value_pairs(emulator, set(), feed, ["a", "b", "y"])]
    assert values == ["a", "b", "y"]
    assert all(len(expose) == 1 for expose in runs) and len(runs) == 6, runs  # a reference and a device run each


def test_values_sized_by_shape_arithmetic_share_runs(monkeypatch):
    """A value whose size onnx's inference leaves symbolic (a Range between two computed sizes, as transformers'
    causal mask makes) is sized at the feed by onnxruntime's symbolic inference: counted as the largest known
    value (GPT-2's decode graph: its 38.6M-element tied embedding), every later value had a run of its own, 1096
    runs and 60 s of a 2-graph export's device check."""
    import numpy as np
    from onnx import TensorProto, helper

    from cann_export.validators import origin
    from cann_export.validators.precision import Emulator, value_types

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Add", ["n", "n"], ["n2"]), helper.make_node("Range", ["n", "n2", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT), helper.make_node("Add", ["rf", "x"], ["a"]),
             helper.make_node("MatMul", ["w", "w"], ["big"]), helper.make_node("Neg", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("big", TensorProto.FLOAT, [300, 300])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("w", TensorProto.FLOAT, [300, 300], np.ones(90000, np.float32))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"x": np.ones(5, dtype=np.float32)}
    sizes = value_types(model, {"x": (5,)})[1]
    assert (sizes["rf"], sizes["a"], sizes["y"]) == (5, 5, 5)
    emulator = Emulator(model, "force_fp16")
    monkeypatch.setattr(origin, "BUDGET", 100000)
    assert len(origin.chunks(emulator, ["rf", "a", "y", "big"], sizes)) == 1  # 90,015 elements in all
    assert [t for t, _, _ in origin.value_pairs(emulator, set(), feed, ["rf", "a", "y"])] == ["rf", "a", "y"]


def test_a_run_takes_the_values_earlier_runs_fetched_instead_of_recomputing_them(monkeypatch):
    """Each exposure run of the per-layer curve feeds the values earlier runs fetched, so a deep graph's first
    layers run once, not once per run (Whisper's 1500-position encoder: 39 -> 5.6 CPU-s for its curve); the values
    are the ones a whole-graph run gives, bit for bit, on both sides."""
    import numpy as np
    from onnx import TensorProto, helper

    from cann_export.validators import origin
    from cann_export.validators.precision import Emulator

    ops = ["Relu", "Neg", "Exp", "Neg", "Abs"]
    names = ["x", *[f"v{k}" for k in range(len(ops) - 1)], "y"]
    nodes = [helper.make_node(op, [a], [b]) for op, a, b in zip(ops, names[:-1], names[1:], strict=True)]
    nodes.append(helper.make_node("Add", ["v0", "v3"], ["skip"]))  # v0 read again four runs later
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 1000]),
                               helper.make_tensor_value_info("skip", TensorProto.FLOAT, [10, 1000])])
    emulator = Emulator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "force_fp16")
    monkeypatch.setattr(origin, "BUDGET", 15000)  # one value per run
    built = []
    build = emulator.build
    monkeypatch.setattr(emulator, "build", lambda *a, **k: built.append(build(*a, **k)[0]) or built[-1:] + [{}])
    feed = {"x": np.random.default_rng(0).standard_normal((10, 1000)).astype(np.float32)}
    order = origin.float_values(emulator)
    got = {t: (e, r) for t, e, r in origin.value_pairs(emulator, set(), feed, order)}
    assert [len(m.graph.node) for m in built[::2]] == [1, 1, 1, 1, 1, 1]  # each reference run: its own node
    assert [sorted(i.name for i in m.graph.input) for m in built[::2]][-1] == ["v0", "v3", "x"]
    whole = emulator.session(expose=order).run(feed, order), emulator.session(expose=order, reference=True).run(
        feed, order)
    for k, t in enumerate(order):
        assert np.array_equal(got[t][0], whole[0][k]) and np.array_equal(got[t][1], whole[1][k]), t


def test_a_value_made_from_weights_alone_is_computed_once_and_fed(monkeypatch):
    """The Transpose of a tied embedding (passes/dedupe.py's, for GPT-2's LM head) is folded by ATC on the host;
    the emulated graphs run no optimiser, so each run transposed the weight and rounded the copy again (0.3 s a run
    on GPT-2's 38.6M elements). It is computed once and fed: the emulated graph holds no Transpose, the device and
    reference outputs are those of the unfolded graph, bit for bit."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from cann_export.validators import origin
    from cann_export.validators.precision import Emulator

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 48)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]),
             helper.make_node("Transpose", ["emb"], ["emb_t"], perm=[1, 0], name="tied_transpose"),
             helper.make_node("MatMul", ["h", "emb_t"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3, 64])],
                              [numpy_helper.from_array(weight, "emb")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"ids": rng.integers(0, 64, (2, 3)).astype(np.int64)}
    folded = Emulator(model, "force_fp16")
    assert folded.folded == {1} and "emb_t" not in origin.float_values(folded)
    assert all(n.op_type != "Transpose" for n in folded.build()[0].graph.node)
    monkeypatch.setattr(Emulator, "_fold_weight_ops", lambda self: set())
    plain = Emulator(model, "force_fp16")
    for reference in (False, True):
        got, want = folded.session(reference=reference).run(feed), plain.session(reference=reference).run(feed)
        assert np.array_equal(got[0], want[0])
