"""The plan of an export (cann_export/decisions.py) is decided once, by the load stage, from the options, the format and
the loaded model; the later stages read it (prepare builds the trace probes when capture will trace first)."""
import dataclasses
from pathlib import Path

import pytest
from helpers.branchy import branchy_loader

import cann_export
from cann_export.context import ExportContext
from cann_export.decisions import module_bytes
from cann_export.load.stage import load
from cann_export.options import ExportOptions


def _loaded(tmp_path: Path, **options) -> ExportContext:
    (tmp_path / "m.branch").write_text("")
    ctx = ExportContext(options=ExportOptions(**options), source=str(tmp_path / "m.branch"),
                        output_path=tmp_path / "m.onnx")
    load(ctx)
    return ctx


def test_the_load_stage_decides_the_plan_once(plugin, tmp_path):
    branchy_loader(plugin, ["torchscript", "dynamo"])
    ctx = _loaded(tmp_path)
    plan = ctx.decisions
    assert plan.exporter_order == ("torchscript", "dynamo") and plan.trace_gated and plan.trace_first
    assert plan.module_bytes == module_bytes(ctx.model) > 0 and not plan.large_graph
    assert not plan.quantized and not plan.fake_quantized and plan.shape_sets is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.trace_first = False


@pytest.mark.parametrize("options", [{"accept_trace_specialization": True}, {"exporter": "torchscript"},
                                     {"external_data_threshold": 1}])
def test_no_trace_first_where_the_gate_cannot_check_it(plugin, tmp_path, options):
    """Accepted traces and a named exporter are not gated; past the large-graph threshold the gate cannot check."""
    branchy_loader(plugin, ["torchscript", "dynamo"])
    plan = _loaded(tmp_path, **options).decisions
    assert not plan.trace_first
    assert plan.large_graph == ("external_data_threshold" in options)


@pytest.mark.parametrize(("order", "probes"), [(["torchscript", "dynamo"], 4), (None, None)])
def test_prepare_builds_the_probes_when_the_plan_traces_first(plugin, tmp_path, order, probes):
    """The prepare stage's trace probes follow the plan: a trace first gets its four sign-flipped / scaled
    examples among the prepared sets; the same model with the exporters' own order (dynamo first) gets none."""
    branchy_loader(plugin, order)
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx", sandbox="off")
    assert result.manifest["parity"]["input_sets_from"].get("trace_path") == probes
