"""Tracer warnings a value probe cannot move (capture/shape_tests.py): a literal ``torch.tensor`` constant is no
specialisation (no gate); a test of sizes on a graph whose sizes follow from its inputs' sizes is gated at the
ranges' sizes without the path probes; anything that may read a value is probed as before."""
from __future__ import annotations

import onnx
import pytest
import torch
from helpers import sized_by_values
from helpers.branchy import ArangeOfValues, NonlocalSize, SizeOfValues, branchy_loader, value_branch_loader
from onnx import TensorProto, helper

import cann_export
from cann_export.errors import CaptureError
from cann_export.capture.shape_tests import classify, sizes_from_shapes_only
from cann_export.capture.trace_guards import Sources


class _Flags(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.is_causal = True
        self.register_buffer("gate", torch.ones(()))


_SIZES = [
    ("ok = x.shape[2] > 1 and mask is None and getattr(module, 'is_causal', True)", "sizes"),
    ("ok = x.size(1) != n", "sizes"),  # n: a Python int in the frame
    ("ok = len(x) > 1 and x.dim() == 3 and x.numel() > 0", "sizes"),
    ("ok = min(x.shape[-1], n) > 1 and x.shape[1:] == x.shape[1:]", "sizes"),
    ("ok = not module.is_causal or x.ndim > 2", "sizes"),
    ("ok = getattr(module, 'missing', False) or x.shape[0] > 1", "sizes"),
    ("q = x.shape[2]\nbsz, q2 = x.shape[:2]\nok = q > 1 and q2 > 1", "sizes"),  # names only ever bound to sizes
    ("q = x.shape[2]\nq = x.sum()\nok = q > 1", None),  # one binding reads a value
    ("for q in x.shape:\n    pass\nok = q > 1", None),  # bound by a loop
    ("q = x.shape[1]\nmatch (t,):\n    case (q,):\n        pass\nok = q > 1", None),  # a match capture
    ("q = x.shape[1]\ntry:\n    pass\nexcept ValueError as q:\n    pass\nok = q > 1", None),
    ("q = x.shape[1]\nwith mask as q:\n    pass\nok = q > 1", None),
    ("q = x.shape[1]\nwith mask:\n    y = q\nok = q > 1", "sizes"),  # used in a with body, not bound there
    ("ok = t.shape[0] > 1 and n > 0 and mask is None", "sizes"),
    ("ok = (p := x.shape[-1] - n) > 0", "sizes"),  # an assignment expression
    ("ok = (p := t) > 0", None),
    ("ok = x.sum() > 0", None),  # a value
    ("ok = t > 0", None),  # a name holding a tensor
    ("ok = x.shape[0] > t", None),
    ("ok = getattr(module, 'gate', True) and x.shape[0] > 1", None),  # a buffer (nn.Module.__getattr__)
    ("ok = module.gate > 0", None),
    ("ok = x.shape[int(t)] > 1", None),
    ("ok = f(x).shape[0] > 1; y = 2", None),  # two statements on the line
    ("ok = torch.tensor([], dtype=x.dtype)", None),  # not a conversion: judged only as a constant warning
    ("ok = dims[-1] > 1 or module.is_causal is not None", "sizes"),  # a tuple of sizes (to_causal_4d's input_shape)
    ("ok = dims[n - 2] > 1", "sizes"),
    ("ok = mixed[-1] > 1", None),  # a tuple holding a tensor that is no size
    ("ok = listed[-1] > 1", None),  # a list: only a tuple is taken
    ("ok = dims[int(t)] > 1", None),  # its index reads a value
    ("ok = (dims := mixed)[0] > 1", None),  # rebound in the test itself
]
_CONSTANTS = [
    ("k = torch.tensor([], dtype=x.dtype, device=x.device)", "constant"),
    ("k = torch.tensor(1.0, dtype=x.dtype) - x", "constant"),
    ("k = torch.tensor([[1, 2], [3, 4]])", "constant"),
    ("k = torch.tensor(n)", None),  # data from a name
    ("k = torch.tensor([]) + torch.as_tensor(t)", None),  # every constructor on the line must be literal
    ("k = x.new_tensor([1.0, 2.0])", "constant"),
    ("k = torch.tensor([x.shape[0]])", None),
    ("k = torch.tensor(1.0) if t else x", "constant"),  # the constant is; the test warns apart (a value)
    ("k = torch.tensor(1.0) + x.sum().item()", None),  # another call on the line
    ("tt = torch.tensor\nk = torch.tensor(1.0) + tt(t)", None),  # a constructor by another name
]


def _classified(tmp_path, line: str, constant: bool) -> str | None:
    """``line``'s last line warned, in a function of ``x, t, n, mask, module`` (earlier lines: what it assigned)."""
    path = tmp_path / "snippet.py"
    lines = line.split("\n")
    path.write_text("def f(x, t, n, mask, module):\n" + "".join(f"    {one}\n" for one in lines))
    frame = type("Frame", (), {"f_locals": {"x": torch.ones(2, 3, 4), "t": torch.tensor(1.0), "n": 3, "mask": None,
                                            "module": _Flags(), "dims": torch.Size([2, 3]),
                                            "mixed": (2, torch.tensor(3.0)), "listed": [2, 3]}})()
    return classify(frame, 1 + len(lines), Sources().index(str(path)), constant)


@pytest.mark.parametrize(("line", "expected"), _SIZES)
def test_what_tests_sizes_only(tmp_path, monkeypatch, line, expected):
    """The source and frame rule; what the tracer recorded before the test is the end-to-end tests' (SizeOfValues)."""
    from cann_export.capture import shape_tests

    monkeypatch.setattr(shape_tests.Trace, "sizes_from_shapes", lambda self: True)
    assert _classified(tmp_path, line, constant=False) == expected


def test_outside_a_trace_no_test_is_taken_for_sizes(tmp_path):
    assert _classified(tmp_path, "ok = x.shape[2] > 1", constant=False) is None


@pytest.mark.parametrize(("line", "expected"), _CONSTANTS)
def test_what_is_a_literal_constant(tmp_path, line, expected):
    assert _classified(tmp_path, line, constant=True) == expected


def _graph(*nodes, inputs=("x",), initializers=()):
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs]
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(list(nodes), "g", ins, [out], initializer=list(initializers)))


def test_sizes_from_shapes_only_follows_values_into_size_operands():
    shape = helper.make_node("Shape", ["x"], ["s"])
    first = helper.make_tensor("i", TensorProto.INT64, [1], [0])
    gather = helper.make_node("Gather", ["s", "i"], ["g"])
    assert sizes_from_shapes_only(_graph(shape, gather, helper.make_node("Reshape", ["x", "s"], ["y"]),
                                         initializers=[first]))
    cast = helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT64)  # the input's values as a shape
    assert not sizes_from_shapes_only(_graph(cast, helper.make_node("Reshape", ["x", "c"], ["y"])))
    assert not sizes_from_shapes_only(_graph(helper.make_node("NonZero", ["x"], ["y"])))
    assert not sizes_from_shapes_only(_graph(helper.make_node("Relu", ["x"], ["y"], domain="com.microsoft")))
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    cond = helper.make_node("If", ["x"], ["y"], then_branch=branch, else_branch=branch)
    assert not sizes_from_shapes_only(_graph(cond))


@pytest.mark.parametrize("module_class", [*sized_by_values.PROBED, *sized_by_values.FINE],
                         ids=lambda c: c.__name__)
def test_a_size_that_values_set_without_a_warning_is_probed(module_class):
    """The one warning tests a size; values set it through a size argument, a write into a tensor or a view of one, a
    conversion inside torch, an op PyTorch does not tag, an untraced ``.data`` read, or a count passed as an argument:
    all probed (capture/trace_taint.py). The controls, a size made from sizes and a size passed as an argument (a
    0-dim tensor the trace computed from ``.shape``), are not. Each traced graph is checked to differ from eager at
    the same size where it is probed, so the case is one only a value probe catches."""
    import io
    import warnings

    from cann_export.capture.exporters import quiet_export
    from cann_export.capture.trace_warnings import tracer_findings

    x, caught = torch.tensor([1.0, 2.0, 3.0, -1.0, 0.2, 0.7]), []
    model = module_class().eval()
    with quiet_export(record=caught):
        torch.onnx.export(model, (x,), io.BytesIO(), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    findings = tracer_findings(caught)
    assert findings and [f["line"] for f in findings] == [findings[0]["line"]]  # the one test, in tail()
    probed = module_class not in sized_by_values.FINE
    assert findings[0]["sizes"] is not probed, findings
    if probed:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(model, (x,), check_trace=False)
        assert any(not torch.equal(traced(x * s), model(x * s)) for s in (-1.0, 4.0, -4.0, 0.25))


@pytest.mark.parametrize("module_class", sized_by_values.UNTRACED, ids=lambda c: c.__name__)
def test_a_tensor_the_trace_does_not_hold_is_no_size_and_the_trace_goes_on(module_class):
    """A 0-dim tensor the test reads that the trace never recorded (an attribute, a default argument, one needing
    grad): torch's lookup records it as a constant (destroying that node left the tracer's map pointing at freed
    memory: a segfault), or would stop the trace (grad): no claim, and the export completes as before."""
    import io

    from cann_export.capture.exporters import quiet_export
    from cann_export.capture.trace_warnings import tracer_findings

    x, caught = torch.tensor([1.0, 2.0, 3.0, -1.0, 0.2, 0.7]), []
    with quiet_export(record=caught):
        torch.onnx.export(module_class().eval(), (x,), io.BytesIO(), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "n"}})
    assert [f["sizes"] for f in tracer_findings(caught)] == [False]


def _export(tmp_path, suffix: str, **options):
    (tmp_path / f"m{suffix}").write_text("")
    return cann_export.export(str(tmp_path / f"m{suffix}"), tmp_path / "m.onnx", export_format="onnx", sandbox="off",
                              **options)


@pytest.mark.parametrize("validate", [True, False])
def test_a_trace_that_tested_sizes_only_is_gated_at_the_sizes_without_probes(plugin, tmp_path, validate):
    """ShapeBranch (``if x.shape[1] > self.size``, size 0: right at every size): the trace is kept after the gate
    judged it at the range's sizes, and no probe was built (the manifest says why)."""
    branchy_loader(plugin, ["torchscript", "dynamo"], size=0)
    result = _export(tmp_path, ".branch", validate=validate)
    assert result.ok and result.onnx["exporter"] == "torchscript", result.manifest["capture"]
    specialized = result.manifest["capture"]["specialized"]
    assert specialized["checked"]["path_variants"] == 0 and "tests sizes only" in specialized["probes"]
    assert len(specialized["checked"]["shapes"]) >= 3  # the range's ends and middle are still judged
    assert not (result.manifest["parity"].get("trace_specialized") or {}).get("other_paths")
    if validate:  # the CLI's line on the traced graph says so
        from cann_export.capture.trace_warnings import short_line

        assert "no probe: it tested sizes only" in short_line(result.manifest["parity"]["trace_specialized"])


def test_a_trace_wrong_at_another_size_is_still_rejected_without_probes(plugin, tmp_path):
    branchy_loader(plugin, ["torchscript", "dynamo"], size=4)
    result = _export(tmp_path, ".branch")
    assert result.ok and result.onnx["exporter"] == "dynamo"
    assert "differs" in result.manifest["capture"]["attempts"][0]["note"]


@pytest.mark.parametrize("module_class", [None, SizeOfValues, ArangeOfValues, NonlocalSize])
def test_a_value_or_a_size_made_from_values_is_probed(plugin, tmp_path, module_class):
    """A branch on a value, and tests of sizes made from values (NonZero; an arange of a count the graph drops; a name
    a nested function rebinds): all get the four probes."""
    if module_class is None:
        value_branch_loader(plugin, ["torchscript", "dynamo"])
    else:
        value_branch_loader(plugin, ["torchscript", "dynamo"], module_class, ".sizeofvalues")
    if module_class in (ArangeOfValues, NonlocalSize):  # x4 reaches the other branch: rejected on a probe, and
        with pytest.raises(CaptureError, match="specialised to the path"):  # dynamo refuses the branch
            _export(tmp_path, ".sizeofvalues", validate=False)
        return
    result = _export(tmp_path, ".valuebranch" if module_class is None else ".sizeofvalues", validate=False)
    capture = result.manifest["capture"]
    assert result.ok and capture["exporter"] == "torchscript", capture
    assert capture["specialized"]["checked"]["path_variants"] == 4 and "probes" not in capture["specialized"]


def test_literal_constants_need_no_gate(plugin, tmp_path):
    """A trace whose only warning is a literal torch.tensor constant: listed with the guards, not specialised."""

    class Constant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)

        def forward(self, x):
            one = torch.tensor(1.0, dtype=x.dtype)  # a line of constructors only (another call could be one)
            return self.proj(x) - one

    value_branch_loader(plugin, ["torchscript", "dynamo"], Constant, ".constant")
    result = _export(tmp_path, ".constant", validate=False)
    capture = result.manifest["capture"]
    assert result.ok and capture["exporter"] == "torchscript" and "specialized" not in capture, capture
    assert [g["line"] for g in capture["guards"]] and "torch.tensor" in capture["guards"][0]["code"]


def test_the_probes_built_after_capture_share_parity_s_session(plugin, tmp_path, monkeypatch):
    """Validating a trace that warned on a value: its probes, built after capture, and the verdict sets run in one
    onnxruntime session of the written graph (a second load cost GPT-2 small's decode graph 1.3 CPU-s)."""
    import collections

    import onnxruntime

    loads: collections.Counter = collections.Counter()
    real = onnxruntime.InferenceSession

    class Counted(real):
        def __init__(self, path, *args, **kwargs):
            loads[str(path)] += 1
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Counted)
    value_branch_loader(plugin, ["torchscript", "dynamo"])
    result = _export(tmp_path, ".valuebranch")
    other = result.manifest["parity"]["trace_specialized"]["other_paths"]
    assert result.ok and other["input_sets"] == 4 and other["passed"]
    assert loads and max(loads.values()) == 1, loads


def test_one_session_keeps_the_graph_s_session_for_one_more_run_only(tmp_path):
    """The probes' session is taken by the verdict sets' run, then freed as before (never held through the
    device-precision runs); outside ``one_session`` nothing is kept."""
    import numpy as np

    from cann_export.validators import parity

    path = tmp_path / "m.onnx"
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    feeds = [{"x": np.ones(2, np.float32)}]
    with parity.one_session(path):
        first, _ = parity.onnx_session(path, feeds)
        second, _ = parity.onnx_session(path, feeds)
        third, _ = parity.onnx_session(path, feeds)
        assert parity._KEPT == {"path": str(path), "kept": True}  # nothing held after the second use
    assert first is second and third is not first and parity._KEPT is None
    assert parity.onnx_session(path, feeds)[0] is not first


def _to_causal_4d_tests_a_tuple_of_sizes() -> bool:
    """Whether this transformers' CLIP builds its causal mask with ``to_causal_4d``, which tests the tuple."""
    import inspect

    try:
        from transformers.modeling_attn_mask_utils import AttentionMaskConverter
        from transformers.models.clip import modeling_clip
    except ImportError:
        return False
    return "input_shape[-1] > 1" in inspect.getsource(AttentionMaskConverter.to_causal_4d) and \
        "_create_4d_causal_attention_mask" in inspect.getsource(modeling_clip)


@pytest.mark.transformers4
@pytest.mark.skipif(not _to_causal_4d_tests_a_tuple_of_sizes(), reason="this transformers' CLIP builds its causal "
                    "mask elsewhere (run: bash tests/transformers4_env.sh; .ci/run runs it)")
def test_clip_s_causal_mask_tests_sizes_only_so_its_trace_is_gated_without_probes(tmp_path):
    """transformers 4.x's ``to_causal_4d`` tests ``input_shape[-1] > 1`` on the tuple of sizes its caller passed:
    a test of sizes (no path probes), still gated at the ranges' ends and middle (sequence_length 1 among them)."""
    from helpers import hf_dirs

    model = hf_dirs.save("clip", tmp_path / "clip")
    result = cann_export.export(str(model), tmp_path / "m.onnx", "onnx", validate=False, sandbox="off")
    specialized = result.manifest["capture"]["specialized"]
    assert any("input_shape[-1] > 1" in w["code"] for w in specialized["warnings"]), specialized
    assert specialized["checked"]["path_variants"] == 0
    assert any(shape.get("sequence_length") == 1 for shape in specialized["checked"]["shapes"]), specialized
