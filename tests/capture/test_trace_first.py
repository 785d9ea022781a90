"""A loader's exporter order (``LoadedModel.extras["exporter_order"]``) under ``--exporter auto``, and the trace
gate (capture/exporter_choice.py): a Hugging Face directory is traced first, as Optimum does, and its trace, which
warned in transformers' mask code, is kept only after it agreed with the model on every prepared input set; a
module whose trace is wrong at another size of its dynamic axis falls back to dynamo, and the manifest says why."""
import numpy as np
import torch
from helpers import hf_dirs
from helpers.branchy import branchy_loader as _branchy_loader
from helpers.branchy import mask_branch_loader

import cann_export
from cann_export import LoadedModel


def test_a_hugging_face_directory_is_traced_first_and_its_checked_trace_passes(tmp_path, run_ort):
    directory = hf_dirs.save("distilbert", tmp_path / "distilbert")
    result = cann_export.export(str(directory), tmp_path / "m.onnx", export_format="onnx")
    assert result.ok and result.onnx["exporter"] == "torchscript", result.onnx
    spec = result.parity["trace_specialized"]  # transformers' mask code made the tracer warn
    assert spec["warnings"] and spec["accepted"] is False
    checked = spec["checked"]
    # every set at the example's shape, the one at each dynamic axis' ends and middle: every prepared set
    assert checked["input_sets"] == result.parity["input_sets"]
    sizes = {s.get("sequence_length") for s in checked["shapes"]}
    assert {1, 60} <= sizes, checked["shapes"]  # seq 1..60 (4 x the dummy's 15): both ends were run
    assert "agrees with the model" in result.manifest["warnings"]["trace"]
    import onnx

    graph = onnx.load(str(tmp_path / "m.onnx")).graph  # the outputs' dims are Optimum's names, as dynamo's were
    assert {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output} == {
        "start_logits": ["batch_size", "sequence_length"], "end_logits": ["batch_size", "sequence_length"]}
    ids = torch.randint(0, 100, (3, 5))  # a batch and a length the export was not traced at
    names, got = run_ort(tmp_path / "m.onnx", {"input_ids": ids, "attention_mask": torch.ones(3, 5, dtype=torch.long)})
    want = hf_dirs.eager("distilbert", directory, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    for name, value in zip(names, got, strict=True):
        np.testing.assert_allclose(value, want[name], atol=2e-4, rtol=1e-3)
    from cann_export.hf.loader import HfDirectoryLoader

    options = cann_export.ExportOptions()  # pixels too: the trace saves more than the gate's probe forwards cost
    vit = HfDirectoryLoader().load(hf_dirs.save("vit", tmp_path / "vit"), options)
    assert vit.extras["exporter_order"] == ["torchscript", "dynamo"]
    assert HfDirectoryLoader().load(directory, options).extras["exporter_order"] == ["torchscript", "dynamo"]


def test_a_trace_wrong_at_another_size_falls_back_to_dynamo_and_says_why(plugin, tmp_path):
    _branchy_loader(plugin, ["torchscript", "dynamo"])
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx")
    assert result.ok and result.onnx["exporter"] == "dynamo", result.onnx
    assert not result.parity.get("trace_specialized")
    first, second = result.manifest["capture"]["attempts"]
    assert (first["exporter"], second["exporter"]) == ("torchscript", "dynamo")
    assert first["note"].startswith("traced graph not kept (tracing warned): the traced graph differs from the model")
    assert "seq=1" in first["note"]  # the shape set where the traced branch is wrong
    # dynamo cannot keep the branch symbolic either: its graph is static in seq, and says so (as before)
    assert any("x:1 (seq" in w for w in result.manifest["warnings"]["dynamic"])


def test_forcing_torchscript_keeps_the_accept_rule_and_no_order_keeps_dynamo_first(plugin, tmp_path):
    _branchy_loader(plugin, None)
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "a.onnx", export_format="onnx")
    assert [a["exporter"] for a in result.manifest["capture"]["attempts"]] == ["dynamo"]
    forced = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "t.onnx", export_format="onnx",
                                exporter="torchscript")
    assert not forced.ok and "--accept-trace-specialization" in forced.parity["reason"]
    assert "checked" not in forced.parity["trace_specialized"]
    # validate re-derives that verdict from the manifest's capture record: failed for the same reason, not a bundle
    # that differs from its manifest (which it said before: re-derived passed, recorded failed)
    bundle = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "t_atc", export_format="atc_ready",
                                exporter="torchscript")
    assert not bundle.ok
    report = cann_export.validate(str(tmp_path / "t_atc"))
    assert report["passed"] is False and "--accept-trace-specialization" in report["reason"]
    assert report["trace_specialized"]["accepted"] is False


def test_without_validation_the_gate_still_checks_the_trace_at_the_other_sizes(plugin, tmp_path, monkeypatch):
    """--no-validate: prepare builds the example only; the gate makes a set at each dynamic axis' ends and middle
    itself, so the branchy trace (wrong at seq=1) is still refused and dynamo writes the graph. The gate runs
    after the write stage, on the graph written (no temporary copy of the raw trace beside it), and its rejection
    sends the stages back to capture: the trace's graph is written, judged, discarded, then dynamo's is written."""
    from types import SimpleNamespace

    from cann_export.graph import onnx_helpers

    written, save = [], onnx_helpers.save_model
    monkeypatch.setattr(onnx_helpers, "save_model", lambda model, path, *a, **k: written.append(path.name)
                        or save(model, path, *a, **k))

    from cann_export.capture.exporter_choice import check, ordered
    from cann_export.decisions import decide
    from cann_export.inputs.path_probes import add_path_references
    from cann_export.validators.graph_judge import PARITY_JUDGE

    _branchy_loader(plugin, ["torchscript", "dynamo"])
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx",
                                validate=False, sandbox="off")
    first, second = result.manifest["capture"]["attempts"]
    assert (first["exporter"], second["exporter"]) == ("torchscript", "dynamo"), first
    assert "differs from the model" in first["note"] and "seq=1" in first["note"], first["note"]
    assert result.onnx["exporter"] == "dynamo" and result.manifest["parity"]["validated"] is False
    assert written == ["captured.onnx", "m.onnx", "captured.onnx", "m.onnx"], written  # no gate's own copy
    # the gate's run is no parity: no checks' cost recorded; dynamo's graph left nothing to check, so validate skipped
    assert "checks" not in result.manifest["parity"] and result.manifest["stage_seconds"]["validate"] == 0.0
    ctx = SimpleNamespace(options=cann_export.ExportOptions(quantize="int8"), loaded=LoadedModel(None, "module"))
    assert check(ctx, None, PARITY_JUDGE, add_path_references) == {"passed": False,
                                                                  "reason": "not checked: a quantized export"}
    exporters = [SimpleNamespace(name="dynamo"), SimpleNamespace(name="torchscript")]
    ctx = SimpleNamespace(options=cann_export.ExportOptions(exporter="torchscript"), loaded=LoadedModel(None, "module"))
    assert [e.name for e in ordered(ctx, exporters)] == ["torchscript"]
    loaded = LoadedModel(None, "module", extras={"exporter_order": ["torchscript", "dynamo"]})
    ctx = SimpleNamespace(options=cann_export.ExportOptions(), loaded=loaded, format=None, quant_table={}, model=None,
                          large_graph=None)
    ctx.decisions = decide(ctx)
    assert [e.name for e in ordered(ctx, exporters)] == ["torchscript", "dynamo"]
    ctx.format = SimpleNamespace(exporter_order=("dynamo",))  # a format's order comes before a loader's
    ctx.decisions = decide(ctx)
    assert [e.name for e in ordered(ctx, exporters)] == ["dynamo", "torchscript"]


def test_without_validation_the_gate_varies_integer_inputs_too(plugin, tmp_path):
    """A trace that branched on the mask (all ones in the example) is wrong on padding: under --no-validate the gate
    draws the realistic sets (masks with padding) itself and refuses it; with no other graph the export stops."""
    import pytest

    from cann_export.errors import CaptureError

    mask_branch_loader(plugin)
    (tmp_path / "m.maskbranch").write_text("")
    with pytest.raises(CaptureError, match="specialised to the path"):
        cann_export.export(str(tmp_path / "m.maskbranch"), tmp_path / "m.onnx", export_format="onnx",
                           validate=False, sandbox="off")
    assert not (tmp_path / "m.onnx").exists()


def test_without_validation_a_fallback_trace_is_not_kept_unchecked(plugin, tmp_path, monkeypatch):
    """--no-validate builds the gate's sets only when the trace comes first; a trace tried after dynamo failed finds
    the example alone, so it is not checked (and not kept: the export stops), never judged at one shape."""
    import pytest

    from cann_export.capture import exporters
    from cann_export.errors import CaptureError

    def fails(self, model, ctx):
        raise RuntimeError("dynamo cannot capture this model")

    monkeypatch.setattr(exporters.DynamoExporter, "export", fails)
    _branchy_loader(plugin, None)  # no order: dynamo first by priority
    (tmp_path / "m.branch").write_text("")
    with pytest.raises(CaptureError, match="specialised to the path"):
        cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx", validate=False,
                           sandbox="off")
    assert not (tmp_path / "m.onnx").exists()
