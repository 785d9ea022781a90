"""ExportContext declares every field, and the stages' reports are typed records with stable JSON."""
import dataclasses
import json
import types
from pathlib import Path

import pytest
import torch
from helpers.toy_models import make_mlp

import cann_export
from cann_export import hookimpl
from cann_export.context import ExportContext
from cann_export.hooks.manager import get_plugin_manager
from cann_export.options import ExportOptions
from cann_export.context import CaptureAttempt, CaptureReport, ParityReport, Reports


def test_an_undeclared_context_field_cannot_be_set():
    ctx = ExportContext(options=ExportOptions(), source=None, output_path=Path("out"))
    ctx.final_onnx = "out/model.onnx"  # declared: fine
    with pytest.raises(AttributeError):
        ctx.final_onnx_path = "out/model.onnx"  # a misspelling is an error, not a new attribute
    with pytest.raises(AttributeError):
        ctx.reports.parity_report = {}


def test_capture_attempts_serialise_as_before():
    ok = CaptureAttempt("dynamo", opset=18, note="wrote opset 18, asked 17 (no converter)")
    failed = CaptureAttempt("torchscript", error="RuntimeError: boom")
    assert json.dumps(ok.to_dict()) == ('{"exporter": "dynamo", "opset": 18, '
                                        '"note": "wrote opset 18, asked 17 (no converter)"}')
    assert failed.to_dict() == {"exporter": "torchscript", "error": "RuntimeError: boom"}
    report = CaptureReport("dynamo", 18, 17, [failed, ok], warning="another opset")
    assert list(report.to_dict()) == ["exporter", "opset", "opset_requested", "attempts", "warning"]
    assert report.to_dict()["attempts"] == [failed.to_dict(), ok.to_dict()]


def test_parity_report_keeps_its_json_and_refuses_unknown_keys():
    data = {"reference": "pytorch eager fp32 (eval mode)", "runtime": "onnxruntime CPUExecutionProvider",
            "input_sets": 5, "tolerance": {"atol": 1e-4}, "outputs": [{"name": "y", "passed": True}],
            "passed": True, "precision": {"mode": "force_fp16"}, "graph_fp32": {"passed": True},
            "device": {"passed": True, "tolerance": None, "outputs": []},
            "input_sets_from": {"example": 1, "random": 4, "parity_data": 0}}
    report = ParityReport.from_dict(data)
    assert report.device.passed and report.passed
    assert json.dumps(report.to_dict()) == json.dumps(data)
    with pytest.raises(TypeError):
        ParityReport.from_dict({**data, "parity_verdict": True})


def test_reports_are_typed_fields_not_string_keys():
    names = {f.name for f in dataclasses.fields(Reports)}
    assert {"parity", "warnings", "quantization", "reference", "lint", "validators", "publish"} <= names
    reports = Reports()
    assert reports.quantization_report("ptq") is reports.quantization_report()
    assert reports.quantization.to_dict() == {"mode": "ptq"}


class _Watcher:
    """A validate-stage validator that keeps the context it saw."""

    name = "watcher"
    stage = "validate"
    formats = "*"
    seen: list = []

    def check(self, ctx):
        self.seen.append(ctx)
        return {"passed": True, "findings": []}


def test_an_export_files_each_report_in_its_typed_place(tmp_path):
    watcher = _Watcher()
    module = types.SimpleNamespace(register_validators=hookimpl(lambda register: register(watcher)))
    pm = get_plugin_manager()
    pm.register(module, name="test-watcher")
    try:
        result = cann_export.export(make_mlp(), tmp_path / "b", "atc_ready", example_inputs=torch.randn(3, 12))
    finally:
        pm.unregister(module)
    ctx = watcher.seen[-1]
    assert isinstance(ctx.reports.parity, ParityReport) and ctx.reports.parity.passed is True
    assert ctx.reports.validators == {"watcher": {"passed": True, "findings": []}}
    assert set(ctx.reports.lint) == set(result.manifest["lint"]) and ctx.reports.lint
    assert isinstance(ctx.capture, CaptureReport)
    assert result.manifest["capture"]["attempts"] == [a.to_dict() for a in ctx.capture.attempts]
    parity_json = json.loads((tmp_path / "b" / "parity.json").read_text())
    assert parity_json == json.loads(json.dumps(ctx.reports.parity.to_dict()))
    assert ctx.reports.reference.device == result.manifest["parity"]["reference_device"]
