"""What a new user meets before any work (issue 46): SoC names checked against the ones ATC knows (a did-you-mean,
--allow-unknown-soc for a newer SoC, recorded), and bad options refused before torch is imported (a refusal in well
under the seconds torch takes to load)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import cann_export
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from cann_export.options import KNOWN_SOCS, ExportOptions

ROOT = Path(__file__).resolve().parents[2]


def _formats():
    from cann_export.hooks.manager import registry

    return registry().formats()


@pytest.mark.parametrize("soc, closest", [("Ascend310P", "Ascend310P1"), ("Ascend310P9", "Ascend310P7"),
                                          ("Ascend910B5", "Ascend910B4")])
def test_a_soc_name_atc_does_not_know_is_refused_with_the_closest(soc, closest):
    with pytest.raises(OptionsError) as caught:
        ExportOptions(soc_version=soc).check(_formats())
    message = str(caught.value)
    assert "did you mean" in message and closest in message and "--allow-unknown-soc" in message


def test_every_known_soc_passes_and_an_allowed_unknown_one_is_a_warning():
    from cann_export.options import check_known_soc

    for soc in KNOWN_SOCS:
        ExportOptions(soc_version=soc).check(_formats())
    ExportOptions(soc_version="Ascend950PR", allow_unknown_soc=True).check(_formats())
    assert check_known_soc("Ascend910B1", False) is None
    assert "Ascend950PR is not a SoC this tool knows" in check_known_soc("Ascend950PR", True)


def test_the_cli_refuses_an_unknown_soc_before_writing_anything(tmp_path):
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "m.pt2"), "-o", str(tmp_path / "b"),
                                      "--soc-version", "Ascend310P"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "did you mean" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b").exists()


def test_an_allowed_unknown_soc_is_exported_with_the_warning_recorded(tmp_path):
    model = torch.nn.Linear(4, 3).eval()
    result = cann_export.export(model, tmp_path / "b", example_inputs=(torch.randn(2, 4),), validate=False,
                                soc_version="Ascend950PR", allow_unknown_soc=True)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert "Ascend950PR is not a SoC this tool knows" in manifest["warnings"]["soc"]
    assert "Ascend950PR" in (tmp_path / "b" / "atc" / "convert.sh").read_text()
    assert result.manifest["warnings"]["soc"] == manifest["warnings"]["soc"]


BAD_OPTIONS = [["--opset", "99"], ["--soc-version", "Ascnd910B"], ["--soc-version", "Ascend310P9"],
               ["--precision-mode", "bogus"], ["--input-shape", "x:a,b"], ["--dynamic", "batch_size=8..1"],
               ["--decode-tokens", "0"], ["--decode-tokens", "x"]]


def _no_torch_env(tmp_path: Path) -> dict:
    """A PYTHONPATH whose ``torch`` fails loudly when imported: a refusal that needs torch exits 3, not 2."""
    fake = tmp_path / "no_torch"
    fake.mkdir(exist_ok=True)
    (fake / "torch.py").write_text("raise SystemExit('torch was imported before the options were checked')\n")
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT)])
    env["CANN_EXPORT_LOAD_PLUGINS"] = ""
    return env


@pytest.mark.parametrize("model", ["m.pt2", "hf_dir"])
@pytest.mark.parametrize("bad", BAD_OPTIONS, ids=lambda b: b[0] + "=" + b[1])
def test_a_bad_option_is_refused_before_torch_is_imported(tmp_path, model, bad):
    path = tmp_path / model
    if model == "hf_dir":  # a Hugging Face directory: its loader asks transformers what graphs it gives
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    else:
        path.write_bytes(b"")
    run = subprocess.run([sys.executable, "-m", "cann_export", "export", str(path), "-o", str(tmp_path / "out"),
                          *bad], env=_no_torch_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr + run.stdout
    assert "torch was imported" not in run.stderr + run.stdout
    assert "error: [options]" in run.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["export", "missing.pt2"], ["export", "missing_dir"], ["lint", "missing.onnx"]],
                         ids=["export-file", "export-dir", "lint"])
def test_a_missing_path_is_refused_before_torch_or_onnx_is_imported(tmp_path, argv):
    env = _no_torch_env(tmp_path)
    fake_onnx = "raise SystemExit('onnx was imported before the path was checked')\n"
    (tmp_path / "no_torch" / "onnx.py").write_text(fake_onnx)
    run = subprocess.run([sys.executable, "-m", "cann_export", *argv[:1], str(tmp_path / argv[1])], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2, run.stderr + run.stdout
    assert "was imported" not in run.stderr + run.stdout
    assert "not found" in run.stderr and "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_torch"]  # nothing written beside
