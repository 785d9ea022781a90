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
    # issue 41: dims past --dynamic's bound (torch then failed with a C++ frame dump, or took 11 GB)
    (["--input-shape", "x:99999999999999999999,4"], {"input_shapes": ["x:99999999999999999999,4"]},
     ["'x:99999999999999999999,4'", "1..1048576"]),
    (["--input-shape", "x:100000000,4"], {"input_shapes": ["x:100000000,4"]}, ["'x:100000000,4'", "1..1048576"]),
    (["--input-shape", "x:1048576,1048576"], {"input_shapes": ["x:1048576,1048576"]},
     ["1099511627776 elements", "1 GiB of float32"]),
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


# ------------------------------------------------------------------ memory bounded before allocation (issue 41)

RSS_CAP = 1 << 30  # the two memory cases of issue 41 took 11-12 GB


@pytest.fixture(scope="module")
def mlp_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2") / "m.pt2"
    torch.export.save(torch.export.export(make_mlp(), (torch.randn(2, 12),)), str(path))
    return path


def npz_declaring(path: Path, shape: tuple[int, ...], descr: str, itemsize: int) -> Path:
    """An .npz whose one member ``x.npy`` honestly holds ``shape`` of zeros, deflated (a few KB per 10 MB)."""
    from numpy.lib import format as npy

    import io
    import zipfile

    header = io.BytesIO()
    npy.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    left = math.prod(shape) * itemsize
    chunk = bytes(16 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            while left > 0:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
    return path


@pytest.fixture(scope="module")
def npz_bomb(tmp_path_factory):
    """Issue 41's file: a ~2 MB .npz whose one member honestly inflates to 2 GiB of float32 zeros (made once)."""
    return npz_declaring(tmp_path_factory.mktemp("bomb") / "p.npz", (22_369_622, 2, 12), "<f4", 4)


def run_rss_capped(cli_env, args):
    from helpers.rss import run_capped

    result = run_capped([sys.executable, "-m", "cann_export", *map(str, args)], cli_env, RSS_CAP, timeout=240)
    assert not result.killed, f"peak RSS {result.peak_bytes >> 20} MiB (cap {RSS_CAP >> 20}) or past the deadline"
    assert result.peak_bytes < RSS_CAP
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "[internal]" not in result.stderr, result.stderr
    return result.stderr


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak RSS is read from /proc")
@pytest.mark.parametrize("case", ["many-samples", "zip-bomb"])
def test_parity_data_that_would_exhaust_memory_is_refused_within_1gb(tmp_path, cli_env, mlp_pt2, npz_bomb, case):
    """Issue 41: a 60 KB .npz of 2.6 M samples ran parity on each (18 KB apiece: 11.9 GB); a 2 MB one declaring
    2 GiB of zeros. Both are refused from the zip directory and the .npy header, before any array exists."""
    if case == "many-samples":
        data, needles = npz_declaring(tmp_path / "p.npz", (2_621_440, 2, 12), "|u1", 1), ["declares [2621440, 2, 12]"]
    else:
        data, needles = npz_bomb, ["16x its size"]
    assert data.stat().st_size < 3 << 20
    out = tmp_path / "out"
    stderr = run_rss_capped(cli_env, [mlp_pt2, "--format", "onnx", "--parity-data", data, "-o", out])
    assert "[prepare]" in stderr and "--parity-data" in stderr and "p.npz" in stderr, stderr
    for needle in needles:
        assert needle in stderr, stderr
    nothing_written(tmp_path, out)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak RSS is read from /proc")
def test_huge_input_shape_is_refused_with_the_options_within_1gb(tmp_path, cli_env, mlp_pt2):
    """Issue 41: --input-shape x:100000000,4 took 11 GB before the .pt2's own guard refused it 30-40 s later."""
    out = tmp_path / "out"
    stderr = run_rss_capped(cli_env, [mlp_pt2, "--input-shape", "x:100000000,4", "-o", out])
    assert "[options]" in stderr and "--input-shape 'x:100000000,4'" in stderr and "1..1048576" in stderr, stderr
    nothing_written(tmp_path, out)


def test_an_input_spec_object_is_bounded_too(tmp_path, junk_model):
    from cann_export.options import InputSpec

    with pytest.raises(OptionsError, match="1..1048576"):
        cann_export.export(str(junk_model), tmp_path / "out", "atc_ready",
                           input_shapes=[InputSpec("x", (10**20, 4))])
    nothing_written(tmp_path, tmp_path / "out")


def test_parity_samples_past_the_bound_are_refused_in_every_layout(tmp_path):
    """Every layout counts its samples before splitting: N/NAME keys, [N, *shape], [N*B, ...] and safetensors."""
    import numpy as np
    from safetensors.numpy import save_file

    from cann_export.errors import PrepareError
    from cann_export.inputs.parity_data import MAX_SAMPLES, read_parity_data

    example = {"x": torch.zeros(2, 12)}
    keyed = tmp_path / "keyed.npz"
    np.savez(keyed, **{f"{i}/x": np.zeros((2, 12), np.float32) for i in range(MAX_SAMPLES + 1)})
    with pytest.raises(PrepareError, match=f"holds {MAX_SAMPLES + 1} samples, more than the {MAX_SAMPLES}"):
        read_parity_data(keyed, example)
    rows = tmp_path / "rows.npz"  # [N*B, 12] cut into batches of 2
    np.savez(rows, x=np.zeros((2 * MAX_SAMPLES + 2, 12), np.float32))
    with pytest.raises(PrepareError, match=f"more than the {MAX_SAMPLES * 24} --parity-data takes"):
        read_parity_data(rows, example)
    cut = tmp_path / "cut.npz"  # [N*B, 12] of 1-row batches: each sample's rows past the bound
    np.savez(cut, x=np.zeros((MAX_SAMPLES + 1, 12), np.float32))
    with pytest.raises(PrepareError, match=f"holds {MAX_SAMPLES + 1} samples"):
        read_parity_data(cut, {"x": torch.zeros(1, 12), "y": torch.zeros(64, 12)})
    big = tmp_path / "big.safetensors"
    save_file({"x": np.zeros((MAX_SAMPLES + 1, 2, 12), np.float32)}, str(big))
    with pytest.raises(PrepareError, match=f"pass at most {MAX_SAMPLES}"):
        read_parity_data(big, example)
    fine = tmp_path / "fine.npz"
    np.savez(fine, x=np.zeros((MAX_SAMPLES, 2, 12), np.float32))
    assert len(read_parity_data(fine, example)) == MAX_SAMPLES


def test_a_calibration_npz_bomb_is_refused_from_its_directory(npz_bomb):
    """--calibration-data reads .npz files through the same checked zip reader (16x its size + 64 MiB at most)."""
    from cann_export.errors import PrepareError
    from cann_export.qat.calibration import read_calibration

    with pytest.raises(PrepareError, match="16x its size") as info:
        read_calibration(npz_bomb, ["x"])
    assert "--calibration-data" in info.value.message
