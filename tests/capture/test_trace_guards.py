"""Tracer warnings from input checks (``if cond: raise`` / ``assert``) specialise nothing: the trace is kept without
the gate or probes and the manifest names them as ``capture.guards``; a check whose exception a caller catches is
control flow, gated as before (capture/trace_guards.py)."""
import ast
import textwrap

import numpy as np
import pytest
import torch
from helpers.branchy import CaughtCheck, FailsAtOne, InputChecks, branchy_loader, checks_loader

import cann_export
from cann_export.capture.trace_guards import Sources, is_guard


@pytest.mark.parametrize("validate", [True, False])
def test_input_checks_are_guards_and_the_trace_is_kept_unspecialised(plugin, tmp_path, run_ort, validate):
    checks_loader(plugin, InputChecks, "input-checks", ".checks")
    (tmp_path / "m.checks").write_text("")
    result = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "m.onnx", export_format="onnx",
                                validate=validate)
    assert result.ok and result.onnx["exporter"] == "torchscript", result.onnx
    capture = result.manifest["capture"]
    codes = [g["code"] for g in capture["guards"]]
    assert codes == ["if x.shape[2] != 3:", 'assert x.shape[1] <= 64, "at most 64 positions"'], codes
    assert "specialized" not in capture and len(capture["attempts"]) == 1, capture
    assert not (result.parity or {}).get("trace_specialized") and "trace" not in result.manifest.get("warnings", {})
    x = torch.randn(2, 40, 3)  # another length than traced (and its range): the graph computes what eager does
    _, (got,) = run_ort(tmp_path / "m.onnx", {"x": x})
    torch.manual_seed(0)
    want = InputChecks().eval()(x).detach().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def _eager_forwards(cls):
    """The forwards of ``cls`` modules outside tracing and dynamo (the references the prepared sets cost)."""
    calls = []

    def hook(module, args, kwargs, output):
        if isinstance(module, cls) and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            calls.append(tuple([*args, *kwargs.values()][0].shape))

    return calls, torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)


def test_without_validation_a_trace_that_warned_only_at_checks_costs_no_gate_sets(plugin, tmp_path):
    """Under --no-validate the gate's sets are built once a trace warned at more than input checks
    (inputs/stage.py add_gate_sets): here the example's forward is the only one."""
    checks_loader(plugin, InputChecks, "input-checks", ".checks")
    (tmp_path / "m.checks").write_text("")
    calls, handle = _eager_forwards(InputChecks)
    try:
        result = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "m.onnx", export_format="onnx",
                                    validate=False, sandbox="off")
        assert result.ok and result.onnx["exporter"] == "torchscript" and calls == [(2, 8, 3)], calls
        calls.clear()
        validated = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "v.onnx", export_format="onnx",
                                       sandbox="off")
    finally:
        handle.remove()
    assert validated.ok and len(calls) >= validated.parity["input_sets"] > 3  # parity's sets, as before
    # but no path probes: nothing a probe could change was traced (4 forwards and 4 onnxruntime runs saved)
    drawn = validated.manifest["parity"]["input_sets_from"]
    assert "trace_path" not in drawn and not validated.parity.get("probes"), validated.manifest["parity"]
    assert calls.count((2, 8, 3)) <= 2 + drawn["random"], calls  # the example, its draws, one check of its own


def test_without_validation_the_gate_builds_its_sets_after_a_trace_warned(plugin, tmp_path):
    """A branch on a size that holds at every size of the range (size 0): the trace warned, so the gate's sets are
    built after capture (the example, the draws, the range's ends and middle; no probe for a test of sizes) and the
    trace kept on them."""
    branchy_loader(plugin, ["torchscript", "dynamo"], size=0)
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx",
                                validate=False, sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript", result.manifest["capture"]
    checked = result.manifest["capture"]["specialized"]["checked"]
    seqs = sorted(s["seq"] for s in checked["shapes"])
    assert checked["path_variants"] == 0 and seqs[0] == 1 and seqs[-1] > 8 and len(seqs) >= 3, checked
    assert checked["input_sets"] >= 1 + 2 + len(seqs) - 1, checked  # no probe: a test of sizes (shape_tests.py)


def test_with_validation_a_trace_that_warned_only_at_checks_is_loaded_by_parity_alone(plugin, tmp_path, monkeypatch):
    """Parity follows, so capture does not load the graph in onnxruntime too: the trace is deferred to parity as a
    gated one is (a graph parity cannot run is rewound to the next exporter), with no gate and no specialisation."""
    from cann_export.graph import onnx_helpers

    loads, check = [], onnx_helpers.check_graph
    monkeypatch.setattr(onnx_helpers, "check_graph", lambda model, *a, loaded=False, **k: loads.append(loaded)
                        or check(model, *a, loaded=loaded, **k))
    checks_loader(plugin, InputChecks, "input-checks", ".checks")
    (tmp_path / "m.checks").write_text("")
    result = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "m.onnx", export_format="onnx", sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript" and result.parity["passed"]
    assert False not in loads, loads  # no onnxruntime load at capture
    assert "specialized" not in result.manifest["capture"] and not result.parity.get("trace_specialized")


def test_without_validation_a_size_the_model_fails_at_is_left_out_of_the_gate_with_a_warning(plugin, tmp_path):
    """The gate's sets come after capture, so the graph holds the axis already: a size the model fails at is not
    checked there, and the manifest says so (a validated export exports such a loader axis static instead)."""
    checks_loader(plugin, FailsAtOne, "fails-at-one", ".failsone")
    (tmp_path / "m.failsone").write_text("")
    result = cann_export.export(str(tmp_path / "m.failsone"), tmp_path / "m.onnx", export_format="onnx",
                                validate=False, sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript", result.manifest["capture"]
    checked = result.manifest["capture"]["specialized"]["checked"]
    assert 1 not in {s["seq"] for s in checked["shapes"]} and len(checked["shapes"]) >= 2, checked
    assert any("seq=1" in w and "did not check" in w for w in result.manifest["warnings"]["dynamic"]), \
        result.manifest["warnings"]


def test_a_guard_only_trace_that_cannot_wait_for_parity_is_checked_at_capture(plugin, tmp_path, monkeypatch):
    """Validating, where the trace cannot be left to parity (the stages cannot go back, --format om, the last
    exporter): kept after capture's own onnxruntime load, as any graph, with no gate."""
    from cann_export.capture import trace_judged_by_parity

    monkeypatch.setattr(trace_judged_by_parity, "defer", lambda *a, **k: None)
    checks_loader(plugin, InputChecks, "input-checks", ".checks")
    (tmp_path / "m.checks").write_text("")
    result = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "m.onnx", export_format="onnx", sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript" and result.parity["passed"], result.manifest
    assert result.manifest["capture"]["guards"] and len(result.manifest["capture"]["attempts"]) == 1


def test_input_checks_need_no_acceptance_when_tracing_is_forced(plugin, tmp_path):
    checks_loader(plugin, InputChecks, "input-checks", ".checks")
    (tmp_path / "m.checks").write_text("")
    result = cann_export.export(str(tmp_path / "m.checks"), tmp_path / "m.onnx", export_format="onnx",
                                exporter="torchscript")
    assert result.ok and result.parity["passed"] and not result.parity.get("trace_specialized")


def test_a_check_a_caller_catches_is_control_flow_and_the_gate_rejects_the_trace(plugin, tmp_path, run_ort):
    checks_loader(plugin, CaughtCheck, "caught-check", ".caught")
    (tmp_path / "m.caught").write_text("")
    result = cann_export.export(str(tmp_path / "m.caught"), tmp_path / "m.onnx", export_format="onnx",
                                validate=False)
    first = result.manifest["capture"]["attempts"][0]
    assert first["exporter"] == "torchscript" and "traced graph not kept" in first.get("note", ""), first
    assert "guards" not in result.manifest["capture"]


def _source(tmp_path, text):
    path = tmp_path / "model_code.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _line(path, needle):
    return next(i for i, line in enumerate(open(path), 1) if needle in line)


@pytest.mark.parametrize(("code", "guard"), [
    ("if x.shape[1] != 3:\n    raise ValueError('channels')\n", True),
    ("if x.shape[1] == 3:\n    y = x\nelse:\n    raise ValueError('channels')\n", True),
    ("assert x.shape[1] == 3, 'channels'\n", True),
    ("if x.shape[1] != 3:\n    print('channels')\n    raise ValueError('channels')\n", False),  # not a lone raise
    ("if x.shape[1] > 0:\n    y = x\n", False),  # control flow
    ("if (n := int(x.shape[1])) != 3:\n    raise ValueError('channels')\n", False),  # binds a value
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError('channels')\nexcept TypeError:\n    pass\n", True),
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError('channels')\nexcept Exception:\n    pass\n", False),
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError\nexcept (TypeError, LookupError):\n    pass\n", True),
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError\nexcept (TypeError, ValueError):\n    pass\n", False),
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError('c')\nexcept MyError:\n    pass\n", False),  # unknown
    ("try:\n    if x.shape[1] != 3:\n        raise MyError('c')\nexcept TypeError:\n    pass\n", False),
    ("try:\n    if x.shape[1] != 3:\n        raise ValueError('c')\nfinally:\n    pass\n", True),  # no handler
    ("for _ in range(2):\n    try:\n        if x.shape[1] != 3:\n            raise ValueError\n"
     "    finally:\n        break\n", False),  # the finally drops it
    ("with tolerant():\n    if x.shape[1] != 3:\n        raise ValueError('c')\n", False),  # may suppress it
    ("if x.shape[1] != 3:\n    raise StopIteration\n", False),  # a loop's end
    ("if x.shape[1] != 3:\n    raise AttributeError('c')\n", False),  # getattr's default
    ("if x.shape[1] != 3:\n    raise KeyError('c')\n", False),
    ("if x.shape[1] != 3:\n    raise MyError('c')\n", False),  # a class the source does not show
    ("assert x.shape[1] == 3; s = float(x.mean())\n", False),  # another statement on the line
    ("if not self.remember(int(x.shape[1])):\n    raise ValueError('c')\n", False),  # a call may store it
    ("if x.dim() != 3 or x.shape[1] != len(x) or not isinstance(x, int):\n    raise TypeError('c')\n", True),
    ("if x.shape[1] != 3:\n    raise ValueError(f'{x.shape[1]} channels')\nelif x.shape[1] > 9:\n    y = 1\n", True),
    ("if x.shape[1] != 3: raise ValueError('c')\n", True),  # its raise on the same line
])
def test_what_counts_as_a_guard(tmp_path, code, guard):
    path = _source(tmp_path, code)
    line = _line(path, "x.shape[1]")
    assert is_guard(path, line, [(path, line)], Sources()) is guard


def test_a_caller_frame_in_a_try_and_unreadable_source_are_not_guards(tmp_path):
    path = _source(tmp_path, """
        def check(x):
            if x.shape[1] != 3:
                raise ValueError('channels')

        def caller(x):
            try:
                check(x)
            except ValueError:
                return None
    """)
    line, call = _line(path, "x.shape[1]"), _line(path, "    check(x)")
    assert is_guard(path, line, [(path, line)], Sources())
    assert not is_guard(path, line, [(path, line), (path, call)], Sources())  # the caller catches it
    assert not is_guard(path, line, None, Sources())  # no stack recorded
    assert not is_guard(str(tmp_path / "gone.py"), 1, [], Sources())


def test_a_warning_indexes_only_the_top_level_statement_that_holds_it(tmp_path):
    """A large file (diffusers' attention_processor.py) is walked only where a warning falls; the answers are the
    whole file's: the check in a method, the caller's try in another function, a module-level line."""
    path = _source(tmp_path, """
        import torch

        class Block:
            def forward(self, x):
                if x.shape[1] != 3:
                    raise ValueError('channels')

        def caller(x):
            try:
                Block().forward(x)
            except ValueError:
                return None

        LIMIT = 3
    """)
    line, call = _line(path, "x.shape[1]"), _line(path, "Block().forward(x)")
    sources = Sources()
    index = sources.index(path, line)
    assert {type(s).__name__ for s in index.statements} >= {"ClassDef", "FunctionDef", "If", "Raise"}
    assert not any(isinstance(s, ast.Try) for s in index.statements)  # caller's function is another part
    assert sources.index(path, call) is not index and sources.index(path, line) is index  # each built once
    assert is_guard(path, line, [(path, line)], sources)
    assert not is_guard(path, line, [(path, line), (path, call)], sources)  # the caller's try still found
    module_level = sources.index(path, _line(path, "LIMIT = 3"))
    assert len(module_level.statements) > len(index.statements)  # a module-level line: the whole file
