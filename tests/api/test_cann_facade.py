"""The seeds' spelling: cann.torch.export with recorded inputs, metadata and ATC hints."""
import itertools
import json

import pytest
import torch
from helpers.toy_models import TwoInputs, make_mlp

import cann.torch
from cann_export import errors


def test_seed_spelling_with_tracked_forward(tmp_path):
    model = cann.torch.track(TwoInputs())
    model(input_ids=torch.randint(0, 50, (1, 6)), features=torch.randn(1, 6, 16))
    result = cann.torch.export(model=model, output_path=str(tmp_path / "b"), export_format="atc_ready",
                               include_optimizer_state=False, metadata={"task": "demo"},
                               atc_hints={"memory_layout": "nhwc_optimized"})
    assert result.ok
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["metadata"] == {"task": "demo"}
    assert manifest["atc"]["hints"] == {"memory_layout": "nhwc_optimized"}
    assert [i["shape"] for i in manifest["model"]["inputs"]] == [[1, 6], [1, 6, 16]]


def test_enable_records_outermost_call_only(tmp_path):
    model = make_mlp()
    assert cann.torch.enable(backend="cpu") == "cpu"  # npu-sim is process-global: its tests use subprocesses
    try:
        model(torch.randn(3, 12))
    finally:
        cann.torch.disable()
    result = cann.torch.export(model=model, output_path=tmp_path / "m.onnx", export_format="onnx")
    assert result.manifest["model"]["inputs"][0]["shape"] == [3, 12]
    from cann_export.inputs.tracking import recorded_inputs

    assert recorded_inputs(model.net[0]) is None  # nested modules were not recorded


def test_format_is_an_alias_of_export_format(tmp_path):
    model = make_mlp()
    result = cann.torch.export(model=model, output_path=tmp_path / "m.onnx", format="onnx",
                               example_inputs=torch.randn(2, 12))
    assert result.format == "onnx" and (tmp_path / "m.onnx").is_file()
    with pytest.raises(errors.OptionsError, match="pass one of them"):
        cann.torch.export(model=model, output_path=tmp_path / "n", format="onnx", export_format="om",
                          example_inputs=torch.randn(2, 12))


def test_without_recorded_inputs_the_error_says_what_to_pass(tmp_path):
    # two inputs and no Conv/Linear/Embedding: no shape to infer (an MLP's is inferred from its first Linear)
    with pytest.raises(errors.PrepareError, match="example_inputs"):
        cann.torch.export(model=torch.nn.Bilinear(4, 4, 2), output_path=tmp_path / "b")


def test_cli_trace_writes_the_stage_timeline(tmp_path):
    from click.testing import CliRunner

    from cann_export.cli.main import cli
    from cann_export.pipeline.table import STAGES

    model = make_mlp().eval()
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 12),)), str(path))
    trace = tmp_path / "trace.json"
    result = CliRunner().invoke(cli, ["export", str(path), "-f", "onnx", "-o", str(tmp_path / "m.onnx"),
                                      "--trace", str(trace)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    events = json.loads(trace.read_text())["traceEvents"]
    stages = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in stages] == [s.name for s in STAGES]  # write twice: staged, then committed
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in stages)
    assert {e["args"]["status"] for e in stages if e["name"] == "capture"} != {"skipped"}
    for before, after in itertools.pairwise(stages):  # one after another, as they ran
        assert after["ts"] + 1e3 >= before["ts"] + before["dur"]


def test_model_zoo_is_reachable_from_import_cann_torch():
    """The seeds call ``cann.model_zoo.publish(...)`` having imported only ``cann.torch``."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import cann.torch; print(cann.model_zoo.publish.__name__, cann.model_zoo.load_model.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": ""})
    assert proc.returncode == 0 and proc.stdout.split() == ["publish", "load_model"], proc.stderr
    import cann

    with pytest.raises(AttributeError):
        _ = cann.no_such_module


def test_include_optimizer_state_uses_the_optimizer_updating_the_model(tmp_path):
    from cann_export.bundle.training_state import load_optimizer_state

    model = cann.torch.track(make_mlp())
    with pytest.raises(errors.OptionsError, match="no live torch.optim optimizer"):
        cann.torch.export(model=model, output_path=tmp_path / "none", include_optimizer_state=True,
                          example_inputs=torch.randn(1, 12))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 12)).sum().backward()
    opt.step()
    result = cann.torch.export(model=model, output_path=tmp_path / "b", include_optimizer_state=True)
    assert result.ok
    saved = load_optimizer_state(tmp_path / "b" / "training" / "optimizer.safetensors")
    assert torch.equal(saved["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(errors.OptionsError, match="2 optimizers update the model"):
        cann.torch.export(model=model, output_path=tmp_path / "c", include_optimizer_state=True)
    assert not (tmp_path / "c").exists() and other is not None


def test_export_makes_the_batch_dynamic_when_the_recorded_calls_varied_it(tmp_path):
    model = cann.torch.track(make_mlp())
    for batch in (8, 8, 2):  # training batches, then one validation call
        model(torch.randn(batch, 12))
    result = cann.torch.export(model=model, output_path=tmp_path / "m.onnx", export_format="onnx")
    assert result.manifest["model"]["inputs"][0]["shape"] == ["batch", 12], result.manifest
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 12)
    got = sess.run(None, {"x": x.numpy()})[0]
    assert torch.allclose(torch.from_numpy(got), model.eval()(x).detach(), atol=1e-5)
    steady = cann.torch.track(make_mlp())
    steady(torch.randn(3, 12))
    steady(torch.randn(3, 12))
    fixed = cann.torch.export(model=steady, output_path=tmp_path / "s.onnx", export_format="onnx")
    assert fixed.manifest["model"]["inputs"][0]["shape"] == [3, 12]  # a batch never varied stays static


class OptionalInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, mask=None, bias=None):
        out = self.lin(x)
        out = out if mask is None else out * mask
        return out if bias is None else out + bias


def test_an_input_seen_in_training_but_not_in_the_last_call_is_kept(tmp_path):
    from helpers.hf_models import tiny_bert, token_inputs

    bert = cann.torch.track(tiny_bert().train())
    feed = token_inputs(batch=4, seq=16)
    bert(**feed)  # training passes the mask
    bert.eval()
    bert(input_ids=feed["input_ids"][:2, :12])  # the last call does not
    result = cann.torch.export(model=bert, output_path=tmp_path / "bert.onnx", export_format="onnx")
    assert [i["name"] for i in result.manifest["model"]["inputs"]] == ["input_ids", "attention_mask"]
    assert "attention_mask" in result.manifest["warnings"]["inputs"]
    # two calls with different optional inputs: the export cannot keep both, and says which it leaves out
    model = cann.torch.track(OptionalInputs())
    model(torch.randn(2, 4), mask=torch.ones(2, 3))
    model(torch.randn(2, 4), bias=torch.ones(3))
    with pytest.warns(UserWarning, match="input\\(s\\) mask seen in earlier calls"):
        dropped = cann.torch.export(model=model, output_path=tmp_path / "opt.onnx", export_format="onnx")
    assert [i["name"] for i in dropped.manifest["model"]["inputs"]] == ["x", "bias"]
    assert "mask" in dropped.manifest["warnings"]["inputs"]
