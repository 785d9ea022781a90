"""The trace gate's check deferred to validate (capture/trace_judged_by_parity.py, pipeline/rewind.py): a warned
trace is kept at capture without an onnxruntime run; parity judges it on the written graph; a failure there sends the
stages back to capture with the trace set aside, and nothing of the rejected graph is left."""
import pytest
from helpers.branchy import branchy_loader

import cann_export


@pytest.fixture
def gate_calls(monkeypatch):
    from cann_export.capture import exporter_choice as trace_gate

    calls = []
    real = trace_gate.check
    monkeypatch.setattr(trace_gate, "check", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _recorder(seen):  # the exports below run unsandboxed: the counted gate calls happen in this process
    return lambda index, stage, status, seconds: seen.append((stage, status))


def _export(plugin, tmp_path, order, seen, fmt="onnx", size=4):
    """The branchy model exported unsandboxed; ``seen`` gets each stage's (name, status) as it ends."""
    branchy_loader(plugin, order, size=size)
    (tmp_path / "m.branch").write_text("")
    return cann_export.export(str(tmp_path / "m.branch"), tmp_path / ("m.onnx" if fmt == "onnx" else "out"),
                              export_format=fmt, sandbox="off", progress=_recorder(seen))


def _count(seen, name):
    return [stage for stage, _ in seen].count(name)


def test_a_rejected_trace_sends_the_stages_back_to_capture_once(plugin, tmp_path, gate_calls):
    seen = []
    result = _export(plugin, tmp_path, ["torchscript", "dynamo"], seen)
    assert not gate_calls  # the check ran once, as parity on the written graph
    assert _count(seen, "capture") == 2 and _count(seen, "validate") == 2 and _count(seen, "commit") == 1
    first = next(status for stage, status in seen if stage == "validate")
    assert first.startswith("traced graph not kept (the traced graph differs from the model")
    assert result.ok and result.onnx["exporter"] == "dynamo"
    assert "trace" not in result.manifest.get("warnings", {})  # nothing of the rejected trace's reports stays
    assert not result.parity.get("trace_specialized")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.branch", "m.onnx"]  # its staged files are gone


def test_a_checked_trace_is_kept_without_the_gate_run(tmp_path, gate_calls):
    from helpers import hf_dirs

    directory = hf_dirs.save("distilbert", tmp_path / "d")
    seen = []
    result = cann_export.export(str(directory), tmp_path / "m.onnx", export_format="onnx", progress=_recorder(seen),
                                sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript"
    assert not gate_calls and _count(seen, "capture") == 1
    checked = result.parity["trace_specialized"]["checked"]
    assert checked["input_sets"] == result.parity["input_sets"]  # every set parity judged, probes included
    assert "agrees with the model" in result.manifest["warnings"]["trace"]


def test_a_rejected_trace_is_still_the_last_resort(plugin, tmp_path, monkeypatch, gate_calls):
    """No other exporter writes a graph: the trace the first validate rejected is captured again, gated now (it
    cannot be deferred twice), and kept with a failing verdict, as before the deferral."""
    from cann_export.capture.exporters import DynamoExporter

    def broken(self, model, ctx):
        raise RuntimeError("dynamo cannot capture this model")

    monkeypatch.setattr(DynamoExporter, "export", broken)
    seen = []
    result = _export(plugin, tmp_path, ["torchscript", "dynamo"], seen)
    assert len(gate_calls) == 1 and _count(seen, "capture") == 2
    assert not result.ok and result.onnx["exporter"] == "torchscript"
    attempts = result.manifest["capture"]["attempts"]
    assert [a["exporter"] for a in attempts] == ["torchscript", "dynamo", "torchscript"], attempts
    assert attempts[0]["note"].startswith("traced graph not kept (tracing warned)")
    assert "dynamo cannot capture" in attempts[1]["error"]


def test_a_trace_with_no_exporter_left_after_it_is_gated_at_capture(plugin, tmp_path, monkeypatch, gate_calls):
    """dynamo first and failing: the trace is the last graph, so the gate judges it in capture (no second pass)."""
    from cann_export.capture.exporters import DynamoExporter

    monkeypatch.setattr(DynamoExporter, "export", lambda self, model, ctx: (_ for _ in ()).throw(RuntimeError("no")))
    seen = []
    result = _export(plugin, tmp_path, ["dynamo", "torchscript"], seen)
    assert len(gate_calls) == 1 and _count(seen, "capture") == 1
    assert [a["exporter"] for a in result.manifest["capture"]["attempts"]] == ["dynamo", "torchscript"]


def test_another_validators_error_is_not_blamed_on_the_trace(plugin, tmp_path, gate_calls):
    """Only parity decides a deferred trace: a validate-stage plugin that raises stops the export as before."""
    from cann_export import errors, hookimpl

    class Broken:
        name, stage, formats = "broken", "validate", "*"

        def check(self, ctx):
            raise RuntimeError("a validator plugin's own bug")

    plugin({"register_validators": hookimpl(lambda register: register(Broken()))}, "broken-validator")
    seen = []
    with pytest.raises(errors.ValidateError, match="validator plugin's own bug"):
        _export(plugin, tmp_path, ["torchscript", "dynamo"], seen)
    assert _count(seen, "capture") == 1 and not (tmp_path / "m.onnx").exists()


def test_a_device_emulation_error_is_not_blamed_on_the_trace(plugin, tmp_path, monkeypatch, gate_calls):
    """atc_ready: device parity runs after the fp32 verdict; its own error is raised, the (correct) trace not
    rejected for it."""
    from cann_export import errors
    from cann_export.validators import parity

    def broken(*args, **kwargs):
        raise RuntimeError("device emulation bug")

    monkeypatch.setattr(parity, "with_device_parity", broken)
    seen = []
    with pytest.raises(errors.ValidateError, match="device emulation bug"):  # size 0: the branch holds at every size
        _export(plugin, tmp_path, ["torchscript", "dynamo"], seen, fmt="atc_ready", size=0)
    assert _count(seen, "capture") == 1 and not (tmp_path / "out").exists()
