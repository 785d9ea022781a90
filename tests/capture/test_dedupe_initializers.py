"""A tied weight is stored once in the written graph (passes/dedupe.py and the optimize stage's hidden weights):
GPT-2's and Llama's LM head shares the token embedding; the graph reads it through a Gather and, transposed,
through the head's MatMul. onnxsim used to fold that Transpose into a second copy of the embedding (GPT-2 small:
154 MB of a 650 MB graph); a graph that already holds equal or transposed copies gets them replaced."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from onnx import TensorProto, helper, numpy_helper

import cann_export
from cann_export import api
from cann_export.passes.dedupe import dedupe


def _copies(model: onnx.ModelProto, weight: np.ndarray) -> list[str]:
    """The initializers holding ``weight`` or its transpose."""
    found = []
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if (a.shape == weight.shape and np.array_equal(a, weight)) or \
                (a.shape == weight.T.shape and np.array_equal(a, weight.T)):
            found.append(t.name)
    return found


@pytest.fixture(scope="module")
def gpt2_bundle(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=1024, n_positions=16,
                                  bos_token_id=0, eos_token_id=None, pad_token_id=0)  # wte: 128 KiB
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    out = tmp_path_factory.mktemp("dedupe") / "gpt2"
    return model, out, api.export_multi(model, out, export_format="onnx", num_random_inputs=1)


def test_gpt2_bundle_stores_the_tied_embedding_once(gpt2_bundle):
    model, out, result = gpt2_bundle
    assert result.ok, result.to_dict()
    wte = model.transformer.wte.weight.detach().numpy()
    for name in ("prefill", "decode"):
        graph = onnx.load(str(out / "components" / name / "model.onnx"))
        assert len(_copies(graph, wte)) == 1, (name, _copies(graph, wte))
        head = [n for n in graph.graph.node if n.op_type == "Transpose" and n.input[0] in _copies(graph, wte)]
        assert head, name  # the LM head reads the embedding through a Transpose onnxruntime folds
        manifest = result.components[name]
        assert manifest["passed"] and manifest["fp32_passed"], manifest


def test_tied_llama_graph_stores_the_embedding_once(tmp_path):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                   tie_word_embeddings=True, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(str(tmp_path / "llama"))
    result = cann_export.export(str(tmp_path / "llama"), tmp_path / "m.onnx", "onnx", task="text-generation")
    assert result.ok and result.parity["passed"], result.parity
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert len(_copies(graph, model.model.embed_tokens.weight.detach().numpy())) == 1


def _graph_with_copies() -> tuple[onnx.ModelProto, np.ndarray]:
    """Gather of an embedding, a MatMul with its transposed copy, two MatMuls with equal weights."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((512, 48)).astype(np.float32)  # 96 KiB: past MIN_BYTES
    w = rng.standard_normal((48, 512)).astype(np.float32)
    inits = [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(np.ascontiguousarray(emb.T), "emb_t"),
             numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w.copy(), "w2"),
             numpy_helper.from_array(np.ascontiguousarray(w.T) * 2, "other")]  # a different tensor stays
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]),
             helper.make_node("MatMul", ["h", "emb_t"], ["logits"]),
             helper.make_node("MatMul", ["h", "w1"], ["a"]),
             helper.make_node("MatMul", ["h", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["ab"]),
             helper.make_node("MatMul", ["ab", "other"], ["c"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3, 512]),
                               helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3, 48])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), emb


def _run(model: onnx.ModelProto, ids: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"ids": ids})


def test_dedupe_replaces_equal_and_transposed_copies_with_identical_outputs():
    model, emb = _graph_with_copies()
    ids = np.array([[1, 5, 511], [0, 7, 300]], dtype=np.int64)
    before = _run(model, ids)
    record = dedupe(model)
    onnx.checker.check_model(model)
    assert record["replaced"] == {"emb_t": "emb", "w2": "w1"}, record
    assert record["bytes_saved"] == 2 * 512 * 48 * 4 and record["transposed"] == ["emb"]
    assert sorted(t.name for t in model.graph.initializer) == ["emb", "other", "w1"]
    assert _copies(model, emb) == ["emb"]
    after = _run(model, ids)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))
    assert dedupe(model)["replaced"] == {}  # nothing left to do


class _Wide(torch.nn.Module):
    """Weights past MIN_BYTES (a dynamo graph's, held back from onnxsim) and a small bias it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("perturb", [False, True])
def test_weights_held_back_from_onnxsim_come_back_whole(tmp_path, monkeypatch, perturb):
    """onnxsim reads the graph without its large weights (graph inputs while it runs); the written graph holds
    each once, with the module's bytes, whether the simplified graph is kept or rejected (changed outputs)."""
    import onnxsim

    real, seen = onnxsim.simplify, []

    def spying(model, *a, **k):
        seen.append(sorted(i.name for i in onnx.load(model).graph.input))
        out, ok = real(model, *a, **k)
        if perturb:  # a simplifier bug: the bias it was given changes
            init = next(t for t in out.graph.initializer if numpy_helper.to_array(t).ndim == 1)
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 1.0, init.name))
            onnx.save(out, k["output_path"])
        return out, ok

    monkeypatch.setattr(onnxsim, "simplify", spying)
    torch.manual_seed(0)
    model = _Wide().eval()
    result = cann_export.export(model, tmp_path / "m.onnx", "onnx", example_inputs=torch.randn(2, 64))
    assert result.ok and result.manifest["capture"]["exporter"] == "dynamo", result.manifest["capture"]
    verdict = result.manifest["optimize"]["onnxsim"]
    assert verdict.startswith("rejected") if perturb else verdict.startswith("applied"), verdict
    assert len(seen) == 1 and len(seen[0]) == 3, seen  # x and the two weights of 64 KiB
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert [i.name for i in graph.graph.input] == ["x"]
    for w in (model.a.weight, model.b.weight):
        w = w.detach().numpy()
        assert len(_copies(graph, w)) == 1


def _matmuls(inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x @ each initializer, one output each (no Gather)."""
    nodes, outs = [], []
    for k, (name, w) in enumerate(inits.items()):
        nodes.append(helper.make_node("MatMul", ["x" if w.shape[0] == 128 else "xt", name], [f"y{k}"]))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [2, w.shape[1]]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128]),
                                           helper.make_tensor_value_info("xt", TensorProto.FLOAT, [2, 256])],
                              outs, [numpy_helper.from_array(w, n) for n, w in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_copies_in_both_orientations_leave_no_reference_to_a_removed_initializer():
    """A, and two equal copies of A's transpose: both end on A (through one Transpose), none on a removed name."""
    a = np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32)
    model = _matmuls({"A": a, "B": np.ascontiguousarray(a.T), "C": np.ascontiguousarray(a.T)})
    feed = {"x": np.ones((2, 128), np.float32), "xt": np.ones((2, 256), np.float32)}
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    record = dedupe(model)
    onnx.checker.check_model(model)
    assert [t.name for t in model.graph.initializer] == ["A"] and set(record["replaced"]) == {"B", "C"}, record
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))


def test_a_transposed_copy_differing_in_the_sign_of_a_zero_is_kept():
    a = np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)
    a[5, 5] = 0.0
    b = np.ascontiguousarray(a.T)
    b[5, 5] = -0.0
    model = _matmuls({"A": a, "B": b})
    assert dedupe(model)["replaced"] == {}


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float64, np.complex128])
def test_a_transposed_copy_is_compared_byte_for_byte_in_each_element_size(dtype):
    """The full comparison of a transposed pair (a block of columns at a time, elements as unsigned integers of
    their size): equal bytes pair, a NaN included; one bit changed in the last block keeps both."""
    a = (np.random.default_rng(3).standard_normal((128, 1024)) * 50).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        a[3, 700] = np.nan
    assert dedupe(_matmuls({"A": a, "B": np.ascontiguousarray(a.T)}))["replaced"] == {"B": "A"}
    b = np.ascontiguousarray(a.T)
    b.reshape(-1).view(np.uint8)[-1] ^= 1
    assert dedupe(_matmuls({"A": a, "B": b}))["replaced"] == {}


class _WeightNormed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(256, 256))

    def forward(self, x):
        return self.lin(x)


def test_a_weight_computed_from_weights_is_still_folded_by_onnxsim(tmp_path):
    """weight_norm's weight is computed from two parameters: onnxsim sees those (a foldable node reads them) and
    folds the norm into one weight, as before weights were held back from it."""
    torch.manual_seed(0)
    result = cann_export.export(_WeightNormed().eval(), tmp_path / "m.onnx", "onnx", exporter="dynamo",
                                example_inputs=torch.randn(2, 256))
    assert result.ok and result.manifest["optimize"]["onnxsim"].startswith("applied"), result.manifest["optimize"]
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert not ops & {"ReduceL2", "Div", "Sqrt", "ReduceSum"}, ops
