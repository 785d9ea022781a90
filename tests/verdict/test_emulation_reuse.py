"""The device check's emulated sessions are built once and cut to what a run fetches: a dynamic graph's device
verdicts at its shape points run one session (onnxruntime takes any size within the graph's dynamic dims), and a
per-layer chunk's run holds only the nodes its values need, with the values of the whole graph's run."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from cann_export.options import Tolerance
from cann_export.validators.precision import Emulator
from cann_export.validators.shape_parity import device_check


def _dynamic_graph():
    """x [batch, 16] -> MatMul -> Relu -> MatMul -> Tanh -> y, the batch dynamic; weights past FED_MIN (fed)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["z"], name="mm2"),
             helper.make_node("Tanh", ["z"], ["y"], name="tanh")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _fp32(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def test_the_device_check_runs_one_session_over_every_shape_point(monkeypatch):
    model = _dynamic_graph()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((b, 16)).astype(np.float32) * 0.1} for b in (2, 1, 7)]
    expected = [_fp32(model, f) for f in feeds]
    built = []
    session = Emulator.session

    def counted(self, *args, **kwargs):
        built.append(args)
        return session(self, *args, **kwargs)

    monkeypatch.setattr(Emulator, "session", counted)
    check = device_check(model, "force_fp16", [], feeds, expected, ["y"], Tolerance(), {}, "saturation", "s19")
    assert [check([s]) for s in range(3)] == [True, True, True]
    assert len(built) == 1


def test_a_chunk_run_holds_only_the_nodes_its_values_need_and_gives_the_whole_graphs_values():
    model = _dynamic_graph()
    emulator = Emulator(model, "force_fp16", "saturation")
    feed = {"x": np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)}
    for reference in (False, True):
        cut, _ = emulator.build(expose=["r"], reference=reference, only=True)
        whole, _ = emulator.build(expose=["r"], reference=reference)
        assert [o.name for o in cut.graph.output] == ["r"]
        assert {n.name for n in cut.graph.node} < {n.name for n in whole.graph.node}
        assert not any(n.name in ("mm2", "tanh") for n in cut.graph.node)
        got = emulator.session(expose=["r"], reference=reference, only=True).run(feed, ["r"])[0]
        want = emulator.session(expose=["r"], reference=reference).run(feed, ["r"])[0]
        np.testing.assert_array_equal(got, want)


def test_a_graph_with_a_subgraph_is_kept_whole():
    from cann_export.validators.precision import needed_nodes

    body = helper.make_graph([helper.make_node("Identity", ["a"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=body),
             helper.make_node("Neg", ["x"], ["n"], name="neg")]
    assert needed_nodes(nodes, ["n"]) == nodes
    plain = [nodes[0], nodes[2]]
    assert needed_nodes(plain, ["n"]) == [nodes[2]]


def test_the_curves_saturation_flag_is_the_rules_own_on_large_values():
    """layers.metrics' short cut (no element reaches the bound: not saturated) gives the flag of the whole test."""
    from cann_export.validators.device_verdict import DevicePolicy
    from cann_export.validators.layers import metrics

    bound, eps = 65504.0, 2.0 ** -10
    rng = np.random.default_rng(3)
    b = rng.standard_normal(8192).astype(np.float32) * 100
    for at, past, want in ((None, None, False), (5, 7e4, True), (5, 6.5e4, False), (-9, -7e4, True)):
        a, e = b.copy(), b.copy()
        if at is not None:
            a[at], e[at] = np.sign(past) * bound, past
        whole = bool(np.any((np.abs(a) == bound) & (np.abs(e) > bound * (1 + 2 * eps))))
        got = metrics(a, e, DevicePolicy(), eps, bound)["overflow"]
        assert got is whole is want


def test_a_graphs_device_checks_share_one_emulator_and_its_weights(monkeypatch, tmp_path):
    """The device verdict at the example's shape and the other shapes' verdicts build one Emulator of the written
    graph, on its weights read from the file once (each built its own: CLIP-base held four copies of its weights)."""
    import onnx

    from cann_export.validators.emulators import emulator_for, shared_emulators
    from cann_export.validators.parity import shape_verdicts, with_device_parity
    from cann_export.validators.precision import fed_weights

    path = tmp_path / "g.onnx"
    onnx.save(_dynamic_graph(), str(path))
    model, fed = fed_weights(path)
    assert "w1" in fed
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((b, 16)).astype(np.float32) * 0.1} for b in (2, 1, 7)]
    expected = [_fp32(onnx.load(str(path)), f) for f in feeds]
    labels = [{"shape": {"batch": b}} for b in (2, 1, 7)]
    made = []
    init = Emulator.__init__
    monkeypatch.setattr(Emulator, "__init__", lambda self, *a, **k: made.append(k.get("fed")) or init(self, *a, **k))
    base = {"passed": True, "outputs": [{"name": "y", "passed": True}], "tolerance": {}}
    with shared_emulators(model, fed):
        report = with_device_parity(base, model, "force_fp16", [], feeds[:1], expected[:1], Tolerance(), {},
                                    layers=True)
        report = shape_verdicts(report, labels, model, [], feeds, expected, Tolerance(), {}, False)
        assert len(made) == 1 and made[0] is fed
        assert emulator_for(model, "force_fp16", "inf_nan") is emulator_for(model, "force_fp16", "inf_nan")
    assert report["device"]["passed"] and len(report["shapes"]) == 3
    whole = _dynamic_graph()
    assert emulator_for(whole, "force_fp16") is not emulator_for(whole, "force_fp16")  # outside: a new one each


def test_weights_in_external_data_are_fed_not_built_into_the_emulated_graph(tmp_path):
    """A graph past external_data_threshold (its weights in a file beside it): the emulator feeds them, as it feeds
    inline ones. Read into the graph instead, the end-to-end check's emulated graph of a 2.3 GB transformer held
    every weight and its rounded copy inline, and protobuf refused to serialise it ("Failed to serialize proto")."""
    import onnx

    from cann_export.validators.precision import fed_weights

    path = tmp_path / "g.onnx"
    onnx.save_model(_dynamic_graph(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="g.onnx.data", size_threshold=0)
    model, fed = fed_weights(path)
    w1, w2 = model.graph.initializer  # w1 past FED_MIN elements (fed), w2 under it (kept in the graph)
    assert set(fed) == {"w1"} and not w1.raw_data and not w1.external_data and not w2.external_data
    np.testing.assert_array_equal(fed["w1"], numpy_helper.to_array(_dynamic_graph().graph.initializer[0]))
    built, weights = Emulator(model, "force_fp16", fed=fed).build(set())
    assert "w1" in weights and all(len(i.raw_data) < 4 * 16 * 64 for i in built.graph.initializer)  # w1 fed
    feed = {"x": np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32) * 0.1}
    got = Emulator(model, "force_fp16", fed=fed).session(set()).run(feed, ["y"])[0]
    np.testing.assert_allclose(got, _fp32(onnx.load(str(path)), feed)[0], atol=1e-2)
