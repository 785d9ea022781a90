"""The plan of an export (cann_export/decisions.py) is decided once, by the load stage, from the options, the format and
the loaded model; the later stages read it (prepare builds the trace probes when capture will trace first)."""
import dataclasses
from pathlib import Path

import pytest
from helpers.branchy import branchy_loader, value_branch_loader

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


def test_the_probes_wait_for_a_trace_that_warned_on_a_value(plugin, tmp_path):
    """The trace probes follow the plan: a trace first that warned on a value is judged on its four sign-flipped /
    scaled examples, built once it warned, so prepare's verdict sets hold none (inputs/stage.py)."""
    value_branch_loader(plugin, ["torchscript", "dynamo"])
    (tmp_path / "m.valuebranch").write_text("")
    result = cann_export.export(str(tmp_path / "m.valuebranch"), tmp_path / "m.onnx", export_format="onnx",
                                sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript"
    assert "trace_path" not in result.manifest["parity"]["input_sets_from"]
    judged = result.manifest["parity"]["trace_specialized"]["other_paths"]
    assert judged["input_sets"] == 4 and judged["passed"], result.manifest["parity"]


def test_no_probes_where_dynamo_comes_first(plugin, tmp_path):
    """The same plan with the exporters' own order (dynamo first, which takes this model): no probes at all."""
    branchy_loader(plugin, None)
    (tmp_path / "m.branch").write_text("")
    result = cann_export.export(str(tmp_path / "m.branch"), tmp_path / "m.onnx", export_format="onnx", sandbox="off")
    assert result.ok and result.onnx["exporter"] == "dynamo"
    assert "trace_path" not in result.manifest["parity"]["input_sets_from"]
    assert not result.manifest["parity"].get("trace_specialized"), result.manifest["parity"]
