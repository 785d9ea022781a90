"""Every error a user can cause: one clear message naming the file and stage, exit code, no traceback,
and nothing left at the output path."""
import json
import shutil
import stat
import zipfile
from pathlib import Path

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


# ------------------------------------------------------------------ report paths checked before the export (issue 41)


@pytest.fixture
def junk_model(tmp_path):
    """Report paths are checked with the options: a refusal at [load] would mean the check came too late."""
    path = tmp_path / "m.pt2"
    path.write_bytes(b"not a model")
    return path


def char_device(tmp_path):
    """A /dev/full of our own (a device node in tmp_path): a regression that replaced it harms nothing."""
    import os

    path = tmp_path / "full"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    return path


def report_targets(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    return {
        "character device": (char_device(tmp_path), "a character device, not a regular file"),
        "FIFO": (fifo, "a FIFO (named pipe), not a regular file"),
        "directory": (tmp_path / "adir", "a directory, not a regular file"),
        "/proc": (Path("/proc/self/mem"), "cannot create a file in /proc/self"),
        "parent is a file": (tmp_path / "afile" / "r.json", "Not a directory"),
    }


REPORT_CASES = [(flag, kind) for flag in ("--trace", "--summary", "--junit")
                for kind in ("character device", "FIFO", "directory", "/proc", "parent is a file")
                if kind != "directory" or flag == "--trace"]  # click refuses a directory for the other two


@pytest.mark.parametrize("flag, kind", REPORT_CASES)
def test_report_paths_are_checked_before_the_export(tmp_path, junk_model, flag, kind):
    target, needle = report_targets(tmp_path)[kind]
    err = fails_cleanly(tmp_path, [str(junk_model), flag, str(target)], stage="options", needles=[flag, needle])
    assert "[load]" not in err
    if kind == "character device":
        assert stat.S_ISCHR(target.stat().st_mode), "the device node was replaced"


def test_a_summary_that_cannot_be_written_refuses_before_the_export_commits(tmp_path):
    """Issue 41: --summary /proc/self/mem was found unwritable only after the bundle was committed."""
    model = files.pt2(tmp_path)
    fails_cleanly(tmp_path, [str(model), "--format", "onnx", "--summary", "/proc/self/mem"], stage="options",
                  needles=["--summary", "/proc/self/mem"])


def test_a_failed_trace_write_is_an_error_naming_the_flag(tmp_path):
    from cann_export.errors import WriteError
    from cann_export.pipeline.timeline import StageTimeline

    (tmp_path / "reports").mkdir()
    record = StageTimeline(tmp_path / "reports" / "trace.json").wrap(None)
    record(1, "load", "ok", 0.1)
    assert (tmp_path / "reports" / "trace.json").is_file()
    shutil.rmtree(tmp_path / "reports")
    (tmp_path / "reports").write_text("now a file")
    with pytest.raises(WriteError, match="--trace: cannot write the stage timeline") as info:
        record(2, "prepare", "ok", 0.1)
    assert info.value.exit_code == 2
