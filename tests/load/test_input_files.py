"""The tensor files a user names (issue 16 items 4-5): ``--example-inputs``, ``--parity-data`` and
``--calibration-data`` must be regular files, refused by stat alone before any read (a device, a FIFO, a
socket, a directory), naming the flag and the file; an .npz is read within bounds (its zip directory, then each
array's header against its member's size). A check that regressed would block on a FIFO or read /dev/zero
forever: every in-process case runs under a deadline (SIGALRM interrupts a blocked open), and one runs the
real command in a child with a timeout."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers.deadline import deadline
from helpers.toy_models import make_mlp

import cann_export
from cann_export.cli.main import cli
from cann_export.errors import LoadError, OptionsError, PrepareError
from cann_export.inputs.parity_data import read_parity_data
from cann_export.load.tensor_files import read_example_inputs
from cann_export.qat.calibration import read_calibration

FLAGS = ("--example-inputs", "--parity-data", "--calibration-data")


@pytest.fixture
def special(tmp_path):
    """Paths that are not regular files, by kind (the socket in a short directory: AF_UNIX paths are short)."""
    fifo = tmp_path / "in.safetensors"
    os.mkfifo(fifo)
    (tmp_path / "dir.safetensors").mkdir()
    short = Path(tempfile.mkdtemp(prefix="ce-"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(short / "s.safetensors"))
    yield {"FIFO": fifo, "character device": Path("/dev/zero"), "directory": tmp_path / "dir.safetensors",
           "socket": short / "s.safetensors", "not found": tmp_path / "missing.safetensors"}
    sock.close()
    shutil.rmtree(short)


@pytest.fixture
def junk_model(tmp_path):
    """The files are checked with the options, before the model is read: a refusal at [load] would be late."""
    path = tmp_path / "m.pt2"
    path.write_bytes(b"not a model")
    return path


KINDS = ("FIFO", "character device", "directory", "socket", "not found")


@pytest.mark.parametrize("flag", FLAGS)
def test_the_cli_refuses_each_kind_before_any_read(tmp_path, junk_model, special, flag):
    for kind in KINDS:
        out = tmp_path / "out"
        with deadline():
            result = CliRunner().invoke(cli, [str(junk_model), flag, str(special[kind]), "-o", str(out)])
        assert result.exit_code == 2, (kind, result.output)
        assert "Traceback" not in result.output and "[internal]" not in result.output, result.output
        for needle in ("[options]", f"the {flag} file", str(special[kind]), kind):
            assert needle in result.stderr, (kind, needle, result.stderr)
        assert not out.exists() and not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]


def test_the_api_refuses_a_fifo_with_the_flag_named(tmp_path, junk_model, special):
    for field, flag in (("example_inputs_file", "example_inputs_file="), ("parity_data", "parity_data="),
                        ("calibration_data", "calibration_data=")):  # the API names its own keyword arguments
        with deadline(), pytest.raises(OptionsError, match=f"the {flag} file is a FIFO") as e:
            cann_export.export(str(junk_model), tmp_path / "out", "atc_ready", **{field: str(special["FIFO"])})
        assert e.value.path == str(special["FIFO"])


def test_the_readers_refuse_too(special):
    """Called without the option check (the Python API, a plugin), each reader stats before it opens."""
    example = {"x": torch.zeros(2, 12)}
    with deadline():
        with pytest.raises(PrepareError, match="the --parity-data file is a FIFO"):
            read_parity_data(special["FIFO"], example)
        with pytest.raises(LoadError, match="the --example-inputs file is a character device"):
            read_example_inputs(special["character device"])
        with pytest.raises(PrepareError, match="the --calibration-data file is a socket"):
            read_calibration(special["socket"], ["x"])
        with pytest.raises(LoadError, match="the example_inputs file is a FIFO"):
            cann_export.export(make_mlp(), special["directory"].parent / "out", "onnx",
                               example_inputs=str(special["FIFO"]))


def test_a_fifo_as_parity_data_is_refused_by_the_real_command(tmp_path, junk_model, special, cli_env):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "cann_export", str(junk_model), "--parity-data",
                             str(special["FIFO"]), "-o", str(out)], env=cli_env, capture_output=True, text=True,
                            timeout=120)  # no writer ever opens the FIFO: a read would block until the timeout
    assert result.returncode == 2, result.stderr
    assert "the --parity-data file is a FIFO" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


# ------------------------------------------------------------------ .npz parity data, bounded


EXAMPLE = {"x": torch.zeros(2, 12)}


def test_an_npz_is_read(tmp_path):
    path = tmp_path / "p.npz"
    np.savez(path, x=np.ones((3, 2, 12), dtype=np.float32))
    samples = read_parity_data(path, EXAMPLE)
    assert len(samples) == 3 and all(torch.equal(s["x"], torch.ones(2, 12)) for s in samples)


def test_an_array_header_larger_than_its_member_is_refused_before_allocating(tmp_path):
    from numpy.lib import format as npy

    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as zf, zf.open("x.npy", "w") as f:
        npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40, 12)})
        f.write(bytes(64))
    with pytest.raises(PrepareError, match=r"member 'x.npy' declares \[1099511627776, 12\] float32"):
        read_parity_data(path, EXAMPLE)


def test_an_npz_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", bytes(96 << 20))  # 96 MiB of zeros in about 100 KiB
    assert path.stat().st_size < 1 << 20
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: pytest.fail("a member was read"))
    with pytest.raises(PrepareError, match="--parity-data"):
        read_parity_data(path, EXAMPLE)


def test_an_object_array_is_refused(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(PrepareError, match="Python objects"):
        read_parity_data(path, EXAMPLE)
