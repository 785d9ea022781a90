"""Every model file format the loaders accept, exported end to end through the CLI."""
import json

import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import files

from cann_export.cli.main import cli


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


def test_input_shape_is_inferred_from_the_first_layer(tmp_path):
    from helpers.toy_models import ConvBnDropout

    path = tmp_path / "convbn_sd.pth"
    torch.save(ConvBnDropout().state_dict(), str(path))
    out = tmp_path / "o"
    result = run([str(path), "-o", str(out), "--model-class", "helpers.toy_models:ConvBnDropout"])
    assert result.exit_code == 0, result.output
    assert "inferred from the first Conv2d (stem.0): --input-shape x:1,3,224,224" in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert "--input-shape x:1,3,224,224" in manifest["warnings"]["inputs"]
    assert manifest["model"]["inputs"][0]["shape"] == [1, 3, 224, 224]


def test_no_inferable_shape_names_the_flag_to_pass(tmp_path):
    from helpers.toy_models import TwoInputs

    path = tmp_path / "two.pth"
    torch.save(TwoInputs().state_dict(), str(path))
    result = run([str(path), "-o", str(tmp_path / "o"), "--model-class", "helpers.toy_models:TwoInputs"])
    assert result.exit_code == 2
    assert "pass --input-shape input_ids:D1,D2,... --input-shape features:D1,D2,..." in result.stderr
    assert "weak reference" not in result.output and not (tmp_path / "o").exists()


def test_model_kwargs_too_deep_or_too_long_give_short_errors(tmp_path):
    path = files.state_dict(tmp_path)
    deep = run([str(path), "-o", str(tmp_path / "o"), "--model-class", files.MLP_CLASS,
                "--model-kwargs", "[" * 50_000 + "]" * 50_000])
    assert deep.exit_code == 2 and "nests too deeply" in deep.stderr and "Traceback" not in deep.output
    long = run([str(path), "-o", str(tmp_path / "o"), "--model-class", files.MLP_CLASS,
                "--model-kwargs", json.dumps({"bogus": "x" * 100_000})])
    assert long.exit_code == 2 and "100013 characters" in long.stderr and len(long.stderr) < 2000
