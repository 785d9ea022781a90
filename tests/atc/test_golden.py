"""`cann-export golden`: a bundle's parity inputs and reference in the layout `msprobe compare -m offline_model`
reads (--input_data: one raw .bin per graph input, in order), with the exact command, run here against a stand-in
`msprobe` that records its arguments."""
import json
import os
import shlex
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from helpers.fake_atc import path_without_atc
from helpers.toy_models import TwoInputs, make_mlp

import cann_export
from cann_export.cli.main import cli
from cann_export.hooks.manager import get_plugin_manager


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    torch.manual_seed(0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        assert cann_export.export(make_mlp(), root / "mlp", example_inputs=(torch.randn(2, 12),)).ok
        feeds = {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)}
        assert cann_export.export(TwoInputs(), root / "two", example_inputs=feeds).ok
    return root


@pytest.mark.parametrize("name", ["mlp", "two"])
def test_golden_inputs_run_the_graph_to_the_stored_reference(bundles, tmp_path, name):
    bundle, out = bundles / name, tmp_path / "golden"
    result = invoke(["golden", bundle, "-o", out, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads((out / "golden.json").read_text())
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i["name"] for i in info["inputs"]] == [i.name for i in session.get_inputs()]  # graph order
    feeds = {}
    for i in info["inputs"]:  # the raw .bin as msprobe reads it: dtype and shape from the graph
        raw = np.fromfile(out / i["bin"], dtype=i["dtype"]).reshape(i["shape"])
        np.testing.assert_array_equal(raw, np.load(out / i["npy"]))
        feeds[i["name"]] = raw
    got = session.run(None, feeds)
    for k, o in enumerate(info["outputs"]):
        np.testing.assert_allclose(got[k], np.load(out / o["npy"]), rtol=1e-3, atol=1e-4)
    assert info["manifest_sha256"] and json.loads(result.stdout)["output"] == str(out)


def fake_msprobe(directory, argv_file):
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "msprobe"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{argv_file}'\n")
    script.chmod(0o755)
    return directory


def test_the_command_is_msprobes_offline_model_compare(bundles, tmp_path):
    bundle, out = bundles / "mlp", tmp_path / "gold dir"  # a space: the script quotes its paths
    assert invoke(["golden", bundle, "-o", out]).exit_code == 0
    argv_file = tmp_path / "argv.txt"
    env = {**os.environ, "PATH": os.pathsep.join([str(fake_msprobe(tmp_path / "bin", argv_file)), os.environ["PATH"]])}
    om = tmp_path / "device model.om"
    subprocess.run(["sh", str(out / "msprobe_compare.sh"), str(om)], env=env, check=True)
    argv = argv_file.read_text().splitlines()
    assert argv[:3] == ["compare", "-m", "offline_model"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags["-gp"] == str((bundle / "model.onnx").resolve()) and flags["-tp"] == str(om)
    assert flags["--input_data"] == str((out / "input_0.bin").resolve())
    assert flags["--input_shape"] == "x:2,12" and flags["-o"] == str((out / "msprobe_out").resolve())
    subprocess.run(["sh", str(out / "msprobe_compare.sh")], env=env, check=True)  # default: the bundle's model.om
    again = argv_file.read_text().splitlines()
    assert again[again.index("-tp") + 1] == str(bundle.resolve() / "model.om")
    assert shlex.split(json.loads((out / "golden.json").read_text())["command"])[0] == "msprobe"


def test_refused_targets_leave_nothing(bundles, tmp_path):
    bundle = bundles / "mlp"
    inside = invoke(["golden", bundle, "-o", bundle / "gold"])
    assert inside.exit_code == 2 and "inside the bundle" in inside.stderr and not (bundle / "gold").exists()
    (tmp_path / "taken").mkdir()
    taken = invoke(["golden", bundle, "-o", tmp_path / "taken"])
    assert taken.exit_code == 2 and "exists" in taken.stderr
    far = invoke(["golden", bundle, "-o", tmp_path / "g", "--set", "99"])
    assert far.exit_code == 2 and "--set 99" in far.stderr and not (tmp_path / "g").exists()
    assert "Traceback" not in inside.output + taken.output + far.output


def test_a_tampered_bundle_is_refused(bundles, tmp_path):
    import shutil

    copy = tmp_path / "mlp"
    shutil.copytree(bundles / "mlp", copy)
    with open(copy / "model.onnx", "ab") as f:
        f.write(b"\0")
    result = invoke(["golden", copy, "-o", tmp_path / "g"])
    assert result.exit_code == 2 and "Traceback" not in result.output and not (tmp_path / "g").exists()
    assert "[golden]" in result.stderr and "model.onnx: contents changed" in result.stderr
