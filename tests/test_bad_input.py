"""Every error a user can cause: one clear message naming the file and stage, exit code, no traceback,
and nothing left at the output path."""
import json
import zipfile

import pytest
from click.testing import CliRunner
from helpers import files

from cann_export.cli.main import cli


def fails_cleanly(tmp_path, args, *, stage, needles, code=2):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [*args, "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    err = result.stderr
    assert f"[{stage}]" in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]
    return err


def test_missing_file(tmp_path):
    fails_cleanly(tmp_path, [str(tmp_path / "nope.pth")], stage="load", needles=["nope.pth", "not found"])


def test_directory_as_model(tmp_path):
    (tmp_path / "d").mkdir()
    fails_cleanly(tmp_path, [str(tmp_path / "d")], stage="load", needles=["is a directory"])


def test_random_bytes_named_pth(tmp_path):
    path = tmp_path / "junk.pth"
    path.write_bytes(bytes(range(256)) * 8)
    fails_cleanly(tmp_path, [str(path)], stage="load", needles=["junk.pth", "not a readable PyTorch file"])


def test_truncated_pt2(tmp_path):
    good = files.pt2(tmp_path)
    bad = tmp_path / "cut.pt2"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    fails_cleanly(tmp_path, [str(bad)], stage="load", needles=["cut.pt2", "truncated or corrupt"])


def test_zip_that_is_not_a_torch_archive(tmp_path):
    path = tmp_path / "notes.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    fails_cleanly(tmp_path, [str(path)], stage="load", needles=["not a torch archive"])


def test_state_dict_without_model_class(tmp_path):
    path = files.state_dict(tmp_path)
    fails_cleanly(tmp_path, [str(path)], stage="load", needles=["--model-class", "state_dict"])


def test_model_class_that_does_not_import(tmp_path):
    path = files.state_dict(tmp_path)
    fails_cleanly(tmp_path, [str(path), "--model-class", "no_such_pkg.models:Net"], stage="load",
                  needles=["does not import", "no_such_pkg"])


def test_model_class_whose_keys_do_not_match(tmp_path):
    path = files.state_dict(tmp_path)
    err = fails_cleanly(tmp_path, [str(path), "--model-class", "helpers.toy_models:ConvBnDropout"], stage="load",
                        needles=["missing keys", "unexpected keys", "net.0.weight", "conv.weight"])
    assert "mlp_sd.pth" in err


@pytest.mark.parametrize("shape", ["x", "x:1,a", "x:1,0", ":1,2", "x:1,2:complex"])
def test_input_shape_that_does_not_parse(shape, tmp_path):
    fails_cleanly(tmp_path, [str(files.torchscript(tmp_path)), "--input-shape", shape], stage="options",
                  needles=["--input-shape"])


def test_input_shape_that_does_not_fit_the_model(tmp_path):
    fails_cleanly(tmp_path, [str(files.torchscript(tmp_path)), "--input-shape", "x:2,7"], stage="prepare",
                  needles=["forward failed", "mat1 and mat2", "mlp_ts.pt"])


def test_input_name_not_in_forward(tmp_path):
    path = files.state_dict(tmp_path)
    fails_cleanly(tmp_path, [str(path), "--model-class", files.MLP_CLASS, "--input-shape", "pixels:1,12"],
                  stage="prepare", needles=["pixels", "not parameters"])


@pytest.mark.parametrize("opset", ["10", "19"])
def test_opset_outside_atc_range(opset, tmp_path):
    fails_cleanly(tmp_path, [str(files.pt2(tmp_path)), "--opset", opset], stage="options",
                  needles=["11..18", f"opset {opset}"])


def test_output_path_exists(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(cli, [str(files.pt2(tmp_path)), "-o", str(out)])
    assert result.exit_code == 2 and "[write]" in result.stderr and "--overwrite" in result.stderr
    assert list(out.iterdir()) == []


def test_errors_as_json(tmp_path):
    result = CliRunner().invoke(cli, [str(tmp_path / "missing.pt2"), "--json", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["error"]["stage"] == "load"
    assert "missing.pt2" in payload["error"]["path"]


def test_bad_model_kwargs_and_metadata(tmp_path):
    path = files.state_dict(tmp_path)
    fails_cleanly(tmp_path, [str(path), "--model-class", files.MLP_CLASS, "--model-kwargs", "{hidden: 3"],
                  stage="options", needles=["--model-kwargs", "JSON"])
    fails_cleanly(tmp_path, [str(path), "--model-class", files.MLP_CLASS, "--metadata", "novalue"],
                  stage="options", needles=["--metadata", "KEY=VALUE"])


def test_corrupt_example_inputs_file(tmp_path):
    bad = tmp_path / "inputs.safetensors"
    bad.write_bytes(b"\x00" * 40)
    fails_cleanly(tmp_path, [str(files.torchscript(tmp_path)), "--example-inputs", str(bad)], stage="load",
                  needles=["inputs.safetensors", "safetensors"])
