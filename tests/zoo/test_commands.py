"""`cann-export zoo ...` (every command with --json) and `cann-export MODEL --publish NAME` end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

from cann.model_zoo import load_model, show
from cann_export.cli.main import cli
from cann_export.hooks.manager import get_plugin_manager

MLP_CLASS = "helpers.toy_models:make_mlp"


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


@pytest.fixture(autouse=True)
def allow_test_models(monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_ALLOW_MODULES", "helpers")  # the test models' module (see test_hostile_zoo)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def ok_json(*args):
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout
    data = json.loads(result.stdout)
    assert data["ok"] is True
    return data


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One atc_ready export published with --publish (the CI step), shared by the tests below."""
    tmp = tmp_path_factory.mktemp("zoo-cli")
    weights = tmp / "mlp.safetensors"
    from safetensors.torch import save_file

    save_file(make_mlp().state_dict(), str(weights))
    zoo = tmp / "zoo"
    result = invoke(weights, "--model-class", MLP_CLASS, "--input-shape", "x:2,12", "--format", "atc_ready",
                    "-o", tmp / "bundle", "--publish", "mlp", "--zoo", zoo, "--metadata", "license=apache-2.0",
                    "--json")
    assert result.exit_code == 0, result.output
    return {"tmp": tmp, "zoo": zoo, "weights": weights, "bundle": tmp / "bundle", "result": json.loads(result.stdout)}


def test_export_publish_end_to_end(exported, run_ort):
    published = exported["result"]["published"]
    assert (published["name"], published["version"], published["existed"]) == ("mlp", "1", False)
    assert published["targets"] == ["atc_ready-Ascend310P3-force_fp16"]
    zoo = str(exported["zoo"])
    path = Path(load_model("mlp", framework="onnx", target="Ascend310P3", zoo=zoo))
    assert (path / "model.onnx").is_file() and (path / "atc" / "convert.sh").is_file()
    bundle_manifest = json.loads((exported["bundle"] / "manifest.json").read_text())
    m = show("mlp", zoo=zoo)["manifest"]
    (lineage,) = m["lineage"]
    assert lineage["onnx_sha256"] == bundle_manifest["files"]["model.onnx"]["sha256"]
    assert lineage["source_weights_sha256"] == bundle_manifest["provenance"]["source_sha256"]
    assert lineage["atc_command"].startswith("atc --framework=5 --model=model.onnx")
    assert lineage["exporter"] and lineage["opset"] and m["card"] == {"license": "apache-2.0"}
    assert m["artifacts"]["atc_ready-Ascend310P3-force_fp16"]["parity"]["passed"] is True
    x = torch.randn(2, 12)
    _, (out,) = run_ort(path / "model.onnx", {"x": x})
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(out), make_mlp().eval()(x), atol=1e-4)
    with pytest.raises(Exception, match="no artifact built for Ascend910B; targets: atc_ready-Ascend310P3"):
        load_model("mlp", framework="onnx", target="Ascend910B", zoo=zoo)


def test_zoo_commands_json(exported):
    zoo, tmp = exported["zoo"], exported["tmp"]
    pub = ok_json("zoo", "publish", exported["weights"], "--name", "mlp", "--model-class", MLP_CLASS,
                  "--artifact", exported["bundle"], "--metadata", "task=regression", "--alias", "staging", "--zoo", zoo)
    assert (pub["version"], pub["kinds"], pub["aliases"]) == ("2", ["pytorch", "atc_ready"], ["staging"])
    again = ok_json("zoo", "publish", exported["weights"], "--name", "mlp", "--model-class", MLP_CLASS,
                    "--artifact", exported["bundle"], "--metadata", "task=regression", "--zoo", zoo)
    assert (again["version"], again["existed"]) == ("2", True)
    listed = ok_json("zoo", "list", "--zoo", zoo)["models"]
    assert [(r["name"], r["versions"], r["aliases"]) for r in listed] == [("mlp", ["1", "2"], {"staging": "2"})]
    alias = ok_json("zoo", "alias", "mlp", "prod", "1", "--zoo", zoo)
    assert (alias["version"], alias["previous"]) == ("1", None)
    assert ok_json("zoo", "alias", "mlp", "prod", "2", "--zoo", zoo)["previous"] == "1"
    shown = ok_json("zoo", "show", "mlp@prod", "--zoo", zoo)
    assert shown["version"] == "2" and shown["manifest"]["architecture"]["callable"] == MLP_CLASS
    assert [(h["alias"], h["previous"], h["version"]) for h in shown["alias_history"]][-2:] == \
        [("prod", None, "1"), ("prod", "1", "2")]
    pulled = ok_json("zoo", "pull", "mlp@prod", "-o", tmp / "deploy", "--target", "Ascend310P3", "--zoo", zoo)
    assert (tmp / "deploy" / "artifacts" / "atc_ready-Ascend310P3-force_fp16" / "model.onnx").is_file()
    assert (tmp / "deploy" / "weights" / "model.safetensors").is_file() and pulled["version"] == "2"
    verified = ok_json("zoo", "verify", "mlp", "--zoo", zoo)
    assert [v["version"] for v in verified["versions"]] == ["1", "2"]
    module = load_model("mlp", "prod", zoo=str(zoo))
    with torch.no_grad():
        x = torch.randn(1, 12)
        assert torch.allclose(module(x), make_mlp().eval()(x))
    # environment variable instead of --zoo
    result = CliRunner(env={"CANN_MODEL_ZOO": str(zoo)}).invoke(cli, ["zoo", "list", "--json"])
    assert json.loads(result.stdout)["models"][0]["name"] == "mlp"


def test_zoo_errors_are_one_message(exported, tmp_path):
    zoo = exported["zoo"]
    for args, code, needle in [
        (("zoo", "show", "nope"), 2, "no model named 'nope'"),
        (("zoo", "publish", tmp_path / "missing.pt", "--name", "x"), 2, "not found"),
        (("zoo", "publish", exported["weights"], "--name", "../x"), 2, "invalid model name"),
        (("zoo", "alias", "mlp", "prod", "9"), 2, "no version or alias '9'"),
        (("zoo", "pull", "mlp", "-o", exported["bundle"]), 2, "output already exists"),
    ]:
        result = invoke(*args, "--zoo", zoo, "--json")
        assert result.exit_code == code, result.output
        err = json.loads(result.stdout)
        assert err["ok"] is False and err["error"]["stage"] == "zoo" and needle in err["error"]["message"]
        assert "Traceback" not in result.output


def test_zoo_verify_reports_tampering(tmp_path):
    zoo = tmp_path / "zoo"
    from helpers.zoo_models import write_weights

    ok_json("zoo", "publish", write_weights(tmp_path / "w.safetensors", 1), "--name", "w", "--zoo", zoo,
            "--model-class", "helpers.zoo_models:Wide", "--model-kwargs", '{"width": 64, "depth": 1}')
    target = zoo / "models" / "w" / "1" / "weights" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[200] ^= 1
    target.write_bytes(bytes(data))
    result = invoke("zoo", "verify", "w", "--zoo", zoo, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and ("weights/model.safetensors: sha256 mismatch"
                                      in report["versions"][0]["problems"][0])
    text = invoke("zoo", "verify", "w", "--zoo", zoo)
    assert "DAMAGED" in text.stdout and "weights/model.safetensors" in text.stdout


def test_zoo_help_does_not_import_torch():
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'))\n"
            "from cann_export.cli.main import main\nsys.argv = ['cann-export', 'zoo', '--help']\nmain()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False).stdout
    assert "publish" in out and "pull" in out and out.strip().endswith("NO-TORCH")
