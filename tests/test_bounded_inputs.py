"""Bounded inputs (issue 16, items 4 and 5): model paths that are not regular files, manifests past their
bounds and option values an export cannot honour are clean refusals (stage, value, what to do; exit 2;
no traceback; nothing written), never a hang, an OOM or an ``[internal]`` error."""
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.fake_atc import path_without_atc
from helpers.toy_models import make_mlp

import cann_export
from cann_export.bundle import read
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from cann_export.fs import digests
from cann_export.hooks.manager import get_plugin_manager


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]


def refused_export(tmp_path, model, args, *, stage, needles):
    out = tmp_path / "out"
    result = invoke([model, *args, "-o", out])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "[internal]" not in result.output, result.output
    assert f"[{stage}]" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    nothing_written(tmp_path, out)
    return result.stderr


# ------------------------------------------------------------------ model paths must be regular files


def run_cli_subprocess(cli_env, args, timeout=120):
    """The real command in a child with a deadline: a read of /dev/zero or a FIFO must not hang the suite."""
    return subprocess.run([sys.executable, "-m", "cann_export", *map(str, args)], env=cli_env, capture_output=True,
                          text=True, timeout=timeout)


def test_dev_zero_is_refused_before_any_read(tmp_path, cli_env):
    out = tmp_path / "out"
    result = run_cli_subprocess(cli_env, ["/dev/zero", "-o", out])
    assert result.returncode == 2, result.stderr
    assert "[load]" in result.stderr and "/dev/zero" in result.stderr and "character device" in result.stderr
    assert "Traceback" not in result.stderr
    nothing_written(tmp_path, out)


def test_fifo_is_refused_promptly(tmp_path, cli_env):
    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    result = run_cli_subprocess(cli_env, [fifo, "-o", out])  # no writer ever opens it: a read would block
    assert result.returncode == 2, result.stderr
    assert "[load]" in result.stderr and "model.pt2" in result.stderr and "FIFO" in result.stderr
    assert "regular file" in result.stderr and "Traceback" not in result.stderr
    nothing_written(tmp_path, out)


def test_socket_and_device_refused_in_process(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="ce-"))  # AF_UNIX paths are limited to ~108 bytes
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(short / "m.pt2"))
        try:
            refused_export(tmp_path, short / "m.pt2", [], stage="load", needles=["m.pt2", "a socket"])
        finally:
            sock.close()
    finally:
        shutil.rmtree(short)
    refused_export(tmp_path, "/dev/null", [], stage="load", needles=["/dev/null", "character device"])


def test_api_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "m.pt2"
    os.mkfifo(fifo)
    with pytest.raises(cann_export.errors.LoadError, match="FIFO") as info:
        cann_export.export(str(fifo), tmp_path / "out", "onnx")
    assert info.value.path == str(fifo)
    nothing_written(tmp_path, tmp_path / "out")


# ------------------------------------------------------------------ manifest bounds


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        assert cann_export.export(make_mlp(), root / "good", "atc_ready", example_inputs=(torch.randn(2, 12),)).ok
    return root / "good"


@pytest.fixture
def bundle(exported, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(exported, path)
    return path


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def refused_validate(path: Path, *needles, commands=("validate",)):
    for command in commands:
        result = invoke([command, path])
        assert result.exit_code == 2, (command, result.output)
        assert "Traceback" not in result.output and "[internal]" not in result.output, result.output
        assert "[validate]" in result.stderr or "manifest.json" in result.stderr, result.stderr
        for needle in needles:
            assert needle in result.stderr, (command, needle, result.stderr)
        assert len(result.stderr) < 5000, "the refusal must not echo a huge value back"


def test_the_untouched_bundle_validates(bundle):
    assert invoke(["validate", bundle]).exit_code == 0


@pytest.mark.parametrize("rel, needle", [
    ("a" * 6000, "6000 characters"),
    ("d/" + "x" * 300, "component of 300 bytes"),
    ("é" * 200, "component of 400 bytes"),
])
def test_long_file_table_path_is_a_clean_refusal(bundle, rel, needle):
    data = manifest(bundle)
    data["files"] = digests.file_table(bundle)
    data["files"][rel] = {"sha256": "0" * 64, "size": 1}
    (bundle / "manifest.json").write_text(json.dumps(data))
    refused_validate(bundle, "manifest.json", needle, commands=("validate", "inspect", "lint"))


def test_long_model_file_name_is_a_clean_refusal(bundle):
    data = manifest(bundle)
    data["model"]["file"] = "m" * 6000 + ".onnx"
    (bundle / "manifest.json").write_text(json.dumps(data))
    refused_validate(bundle, "model.file", "at most 255 bytes")


def test_file_problems_bounds_paths_before_the_disk(bundle):
    data = manifest(bundle)
    data["files"]["a" * 6000] = {"sha256": "0" * 64, "size": 1}
    problems = read.file_problems(bundle, data)
    assert any("6000 characters" in p for p in problems), problems


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_manifest_is_a_clean_refusal(bundle, depth):
    text = (bundle / "manifest.json").read_text().rstrip()
    assert text.endswith("}")
    (bundle / "manifest.json").write_text(text[:-1] + ', "provenance_extra": ' + "[" * depth + "]" * depth + "}")
    refused_validate(bundle, "manifest.json", "nests deeper than 64")


def test_json_depth_counts_without_recursion():
    assert read.json_depth(1) == 0 and read.json_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert read.json_depth(deep) > read.MAX_JSON_DEPTH


def test_oversized_manifest_is_a_clean_refusal(bundle, monkeypatch):
    monkeypatch.setattr(read, "MAX_MANIFEST_BYTES", 4096)
    data = manifest(bundle)
    data["provenance"]["padding"] = "x" * 8192
    (bundle / "manifest.json").write_text(json.dumps(data))
    refused_validate(bundle, "manifest.json", "larger than")


def test_an_exported_manifest_is_well_inside_the_bounds(exported):
    raw = (exported / "manifest.json").read_bytes()
    assert len(raw) < read.MAX_MANIFEST_BYTES // 100
    assert read.json_depth(json.loads(raw)) <= 10


# ------------------------------------------------------------------ options users type


@pytest.fixture
def junk_model(tmp_path):
    """Options are checked before the model is read: a refusal must come at [options], never at [load]."""
    path = tmp_path / "m.pt2"
    path.write_bytes(b"not a model")
    return path


OPTION_CASES = [
    # (CLI args, API kwargs, message needles)
    (["--soc-version", ""], {"soc_version": ""}, ["--soc-version ''", "Ascend SoC"]),
    (["--soc-version", "Ascend310P3 --log=debug"], {"soc_version": "Ascend310P3 --log=debug"},
     ["'Ascend310P3 --log=debug'", "did you mean Ascend310P3?"]),
    (["--soc-version", "Ascend31OP3"], {"soc_version": "Ascend31OP3"}, ["did you mean Ascend310P3?"]),
    (["--soc-version", "ascend910b"], {"soc_version": "ascend910b"}, ["did you mean Ascend910B?"]),
    (["--atc-hint", "soc_version=Ascend910 x"], {"atc_hints": {"soc_version": "Ascend910 x"}},
     ["soc_version", "did you mean Ascend910"]),
    (["--atol", "nan"], {"atol": math.nan}, ["--atol nan", "finite"]),
    (["--atol", "inf"], {"atol": math.inf}, ["--atol inf", "finite"]),
    (["--rtol", "-0.1"], {"rtol": -0.1}, ["--rtol -0.1", ">= 0"]),
    (["--min-cosine", "nan"], {"min_cosine": math.nan}, ["--min-cosine nan", "between -1 and 1"]),
    (["--min-cosine", "1.5"], {"min_cosine": 1.5}, ["--min-cosine 1.5", "between -1 and 1"]),
    (["--min-cosine", "-2"], {"min_cosine": -2.0}, ["--min-cosine -2.0", "between -1 and 1"]),
    (["--input-shape", "x:1,12", "--input-shape", "x:2,12"], {"input_shapes": ["x:1,12", "x:2,12"]},
     ["--input-shape", "'x' twice"]),
    (["--metadata", "cann_export.tool=evil"], {"metadata": {"cann_export.tool": "evil"}},
     ["'cann_export.tool'", "reserved", "provenance"]),
]


@pytest.mark.parametrize("args, kwargs, needles", OPTION_CASES, ids=[" ".join(c[0]) for c in OPTION_CASES])
def test_option_refused_by_cli(tmp_path, junk_model, args, kwargs, needles):
    refused_export(tmp_path, junk_model, args, stage="options", needles=needles)


@pytest.mark.parametrize("args, kwargs, needles", OPTION_CASES, ids=[" ".join(c[0]) for c in OPTION_CASES])
def test_option_refused_by_api(tmp_path, junk_model, args, kwargs, needles):
    out = tmp_path / "out"
    with pytest.raises(OptionsError) as info:
        cann_export.export(str(junk_model), out, "atc_ready", **kwargs)
    for needle in needles:
        needle = _api_spelling(needle)
        assert needle in str(info.value), (needle, str(info.value))
    nothing_written(tmp_path, out)


def _api_spelling(needle: str) -> str:
    """A CLI needle as the Python API's error names it: its keyword argument, not the flag."""
    for flag, keyword in (("--soc-version ", "soc_version="), ("--atol ", "atol="), ("--rtol ", "rtol="),
                          ("--min-cosine ", "min_cosine="), ("--input-shape", "input_shapes=")):
        needle = needle.replace(flag, keyword)
    return needle


def test_device_tolerances_through_the_api(tmp_path, junk_model):
    for tol, needle in ((dict(device_atol=math.nan), "tolerance.device_atol nan"),
                        (dict(device_min_cosine=2.0), "tolerance.device_min_cosine 2.0")):
        with pytest.raises(OptionsError, match=needle):
            cann_export.export(str(junk_model), tmp_path / "out", "atc_ready", tolerance=tol)
    nothing_written(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("soc", ["Ascend310P3", "Ascend910B", "Ascend910_9391", "Ascend999X"])
def test_soc_names_of_the_validators_shape_pass_the_option_check(soc):
    from cann_export.bundle import rederive
    from cann_export.options import check_soc_version

    assert check_soc_version(soc) == soc == rederive.check_soc(soc)


def test_accepted_options_still_export_a_bundle_validate_accepts(tmp_path):
    out = tmp_path / "b"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        result = cann_export.export(make_mlp(), out, "atc_ready", example_inputs=(torch.randn(2, 12),),
                                    soc_version="Ascend910B", metadata={"tool": "mine"})
    assert result.ok and result.manifest["metadata"]["tool"] == "mine"
    assert invoke(["validate", out]).exit_code == 0
