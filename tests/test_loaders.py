"""Every model file format the loaders accept, exported end to end through the CLI."""
import json

import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import files

from cann_export.cli import cli


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("kind,extra", [
    ("pt2", []),
    ("torchscript", ["--input-shape", "x:2,12"]),
    ("state_dict", ["--model-class", files.MLP_CLASS, "--input-shape", "x:2,12"]),
    ("checkpoint", ["--model-class", files.MLP_CLASS, "--input-shape", "x:2,12"]),
    ("safetensors_weights", ["--model-class", files.MLP_CLASS, "--model-kwargs", '{"hidden": 32}',
                             "--input-shape", "x:2,12"]),
])
def test_each_model_format_exports(kind, extra, tmp_path):
    path = getattr(files, kind)(tmp_path)
    out = tmp_path / "out"
    result = run([str(path), "-o", str(out), "--json", *extra])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["ok"] and payload["parity"]["passed"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["provenance"]["source_sha256"] and manifest["model"]["inputs"][0]["shape"] == [2, 12]
    graph = onnx.load(str(out / "model.onnx"))
    assert "Dropout" not in {n.op_type for n in graph.graph.node}


def test_pt2_uses_the_archives_example_inputs(tmp_path):
    result = run([str(files.pt2(tmp_path)), "-o", str(tmp_path / "o"), "--json"])
    payload = json.loads(result.stdout)
    assert payload["ok"]
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["provenance"]["source_kind"] == "exported_program"


def test_pt2_exported_in_train_mode_is_stripped(tmp_path):
    from helpers.toy_models import make_mlp

    path = tmp_path / "train.pt2"
    torch.export.save(torch.export.export(make_mlp().train(), (torch.randn(2, 12),)), str(path))
    result = run([str(path), "-o", str(tmp_path / "o"), "--json"])
    assert json.loads(result.stdout)["parity"]["passed"]  # dropout would make parity fail


def test_whole_pickled_module_needs_trust(tmp_path):
    path = files.pickled_module(tmp_path)
    refused = run([str(path), "-o", str(tmp_path / "o"), "--input-shape", "x:1,12"])
    assert refused.exit_code == 2
    assert "--trust-pickle" in refused.stderr and "weights_only" in refused.stderr
    assert not (tmp_path / "o").exists()
    trusted = run([str(path), "-o", str(tmp_path / "o"), "--input-shape", "x:1,12", "--trust-pickle"])
    assert trusted.exit_code == 0, trusted.output


@pytest.mark.parametrize("zipped", [True, False])
def test_malicious_pickle_never_runs(zipped, tmp_path):
    marker = tmp_path / "pwned"
    path = files.malicious_pickle(tmp_path, marker, zipped)
    result = run([str(path), "-o", str(tmp_path / "o"), "--model-class", files.MLP_CLASS])
    assert result.exit_code == 2
    assert not marker.exists()
    assert "refused to unpickle" in result.stderr and str(path) in result.stderr
    assert "Traceback" not in result.output


def test_torchscript_conv_bn_is_folded_in_the_graph(tmp_path):
    from helpers.toy_models import ConvBnDropout

    path = tmp_path / "convbn_ts.pt"
    torch.jit.save(torch.jit.script(ConvBnDropout().eval()), str(path))
    result = run([str(path), "-o", str(tmp_path / "o"), "--input-shape", "x:1,3,8,8", "--json"])
    assert json.loads(result.stdout)["parity"]["passed"], result.output
    ops = [n.op_type for n in onnx.load(str(tmp_path / "o" / "model.onnx")).graph.node]
    assert "BatchNormalization" not in ops and ops.count("Conv") == 2
