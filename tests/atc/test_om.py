"""The om format: om-stubs without ATC, a (fake) ATC on PATH, and `cann-export convert`."""
import hashlib
import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import files
from helpers.fake_atc import ERROR_LINE, fake_atc, path_without_atc
from helpers.toy_models import make_mlp

import cann_export
from cann_export.bundle import om_format as om
from cann_export.cli.main import cli
from cann_export.errors import ValidateError
from cann_export.hooks.manager import get_plugin_manager

@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def no_atc(monkeypatch):
    monkeypatch.setenv("PATH", path_without_atc())
    assert shutil.which("atc") is None


@pytest.fixture
def with_fake_atc(monkeypatch, tmp_path):
    argv_file = tmp_path / "atc_argv.txt"
    bin_dir = fake_atc(tmp_path / "fakebin", argv_file)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_atc()]))
    assert shutil.which("atc") == str(bin_dir / "atc")
    return argv_file


@pytest.fixture
def with_failing_atc(monkeypatch, tmp_path):
    argv_file = tmp_path / "atc_argv.txt"
    bin_dir = fake_atc(tmp_path / "failbin", argv_file, fail=True)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_atc()]))
    return argv_file


@pytest.fixture(scope="module")
def stub_bundle(tmp_path_factory):
    """An om export of a small MLP made without atc on PATH: the bundle directory holding model.om."""
    out = tmp_path_factory.mktemp("om") / "mlp_om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        result = cann_export.export(make_mlp(), out, "om", example_inputs=(torch.randn(2, 12),))
    assert result.ok
    return out


@pytest.fixture
def stub(stub_bundle, tmp_path):
    """A private copy of the stub, free to damage."""
    path = tmp_path / "mlp.om"
    shutil.copy2(stub_bundle / "model.om", path)
    return path


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def export_cli(tmp_path: Path, out: Path, *extra):
    model = files.state_dict(tmp_path)
    return invoke([model, "--model-class", files.MLP_CLASS, "--input-shape", "x:2,12", "--format", "om",
                   "-o", out, *extra])


# ------------------------------------------------------------------ stubs


def test_om_export_without_atc_writes_a_stub_with_an_atc_header(stub_bundle):
    names = {p.relative_to(stub_bundle).as_posix() for p in stub_bundle.rglob("*") if p.is_file()}
    assert names >= {"model.om", "model.onnx", "manifest.json", "parity.json", "atc/convert.sh",
                     "parity/inputs.safetensors", "parity/expected.safetensors"}
    raw = (stub_bundle / "model.om").read_bytes()
    # ATC's ModelFileHeader, read at the byte offsets of GraphEngine's struct (not through our own parser)
    assert raw[:4] == b"IMOD" and struct.unpack_from("<I", raw, 0)[0] == 0x444F4D49
    assert struct.unpack_from("<I", raw, 4)[0] == 256
    assert struct.unpack_from("<I", raw, 8)[0] == 0x10000000
    assert struct.unpack_from("<I", raw, 76)[0] == len(raw) - 256
    assert raw[84:116].rstrip(b"\0") == b"MLP"
    assert raw[120:152].rstrip(b"\0") == b"CANN-EXPORT-STUB/2"
    assert raw[156:176].rstrip(b"\0") == b"Ascend310P3"
    # the digest covers the whole header (its own field zeroed) and the payload
    assert raw[12:76].decode() == hashlib.sha256(raw[:12] + b"\0" * 64 + raw[76:]).hexdigest()

    header, payload = om.read_stub(stub_bundle / "model.om")
    assert (header["magic"], header["headsize"], header["length"]) == (0x444F4D49, 256, len(raw) - 256)
    assert header["name"] == "MLP" and header["userdefineinfo"] == "CANN-EXPORT-STUB/2"
    assert header["stub"] and header["stub_version"] == 2
    assert payload == raw[256:]

    manifest = manifest_of(stub_bundle)
    atc = manifest["atc"]
    assert manifest["format"] == "om" and atc["ran"] is False and atc["exit_code"] is None
    assert atc["om"]["kind"] == "stub" and atc["om"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert manifest["files"]["model.om"]["sha256"] == atc["om"]["sha256"]


def test_stub_payload_is_the_atc_ready_bundle(stub_bundle, tmp_path):
    with zipfile.ZipFile(stub_bundle / "model.om") as zf:  # the payload is a plain zip after the header
        members = set(zf.namelist())
    assert members == {"model.onnx", "manifest.json", "parity.json", "report.html", "atc/convert.sh",
                       "torch/program.pt2", "parity/inputs.safetensors", "parity/expected.safetensors"}
    header = om.extract_stub(stub_bundle / "model.om", tmp_path / "x")
    assert header["name"] == "MLP"
    for rel in members - {"manifest.json"}:
        assert (tmp_path / "x" / rel).read_bytes() == (stub_bundle / rel).read_bytes(), rel
    assert os.access(tmp_path / "x" / "atc" / "convert.sh", os.X_OK)
    inner = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert "model.om" not in inner["files"] and inner["atc"]["command"] == manifest_of(stub_bundle)["atc"]["command"]


def test_validate_and_inspect_read_a_stub(stub):
    ok = invoke(["validate", stub, "--json"])
    assert ok.exit_code == 0, ok.output
    payload = json.loads(ok.stdout)
    assert payload["ok"] is True and payload["parity"]["passed"] is True
    assert cann_export.validate(stub)["passed"] is True

    info = json.loads(invoke(["inspect", stub, "--json"]).stdout)
    assert info["kind"] == "om-stub" and info["path"] == str(stub)
    assert info["om"]["name"] == "MLP" and info["om"]["length"] == stub.stat().st_size - 256
    assert info["om"]["userdefineinfo"].startswith("CANN-EXPORT-STUB")
    assert info["inputs"][0]["name"] == "x" and "Gemm" in info["ops"]


def _flip_payload_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[300] ^= 0xFF
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _bad_magic(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[0:4] = b"NOPE"
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, words", [
    (_flip_payload_byte, "sha256"), (_truncate, "truncated"), (_short, "truncated"), (_bad_magic, "magic"),
])
def test_damaged_stub_is_refused_by_inspect_validate_and_convert(stub, with_fake_atc, tmp_path, damage, words):
    damage(stub)
    with pytest.raises(ValidateError, match=words):
        om.read_stub(stub)
    for command in (["inspect", stub], ["validate", stub], ["convert", stub, "-o", tmp_path / "deploy.om"]):
        result = invoke(command)
        assert result.exit_code == 2, (command, result.output)
        assert words in result.stderr and str(stub) in result.stderr, result.stderr
        assert "Traceback" not in result.output
    assert not with_fake_atc.exists()  # ATC never ran on the damaged stub
    assert not (tmp_path / "deploy.om").exists()


def test_a_real_om_is_not_mistaken_for_a_stub(stub):
    raw = bytearray(stub.read_bytes())
    raw[120:152] = b"\0" * 32  # no stub mark: what ATC itself writes
    stub.write_bytes(bytes(raw))
    result = invoke(["validate", stub])
    assert result.exit_code == 2 and "not a cann-export om-stub" in result.stderr
    info = json.loads(invoke(["inspect", stub, "--json"]).stdout)  # inspect reads it as what it is: compiled
    assert info["kind"] == "om" and info["om"]["kind"] == "compiled" and info["om"]["layout"] == "2019-20"


# ------------------------------------------------------------------ with ATC on PATH


def test_om_export_runs_atc_with_the_rendered_command(tmp_path, with_fake_atc):
    out = tmp_path / "bundle"
    result = export_cli(tmp_path, out)
    assert result.exit_code == 0, result.output
    manifest = manifest_of(out)
    command = manifest["atc"]["command"]
    assert command[0] == "atc" and "--output=model" in command
    assert with_fake_atc.read_text().splitlines() == command[1:]
    assert (out / "atc" / "convert.sh").read_text().rstrip().endswith(" ".join(command[1:]) + ' "$@"')
    om_bytes = (out / "model.om").read_bytes()
    assert om_bytes.startswith(b"FAKE-OM ")
    atc = manifest["atc"]
    assert atc["ran"] is True and atc["exit_code"] == 0 and atc["om"]["kind"] == "atc"
    assert atc["om"]["sha256"] == hashlib.sha256(om_bytes).hexdigest()
    assert "ATC run success" in (out / "atc" / "atc.log").read_text()
    assert {"model.om", "atc/atc.log"} <= set(manifest["files"])
    assert invoke(["validate", out]).exit_code == 0


def test_failing_atc_fails_the_export_with_its_own_message(tmp_path, with_failing_atc):
    out = tmp_path / "bundle"
    result = export_cli(tmp_path, out)
    assert result.exit_code == 3, result.output
    assert ERROR_LINE in result.stderr and "[write]" in result.stderr and "exit 1" in result.stderr
    assert "Traceback" not in result.output
    assert with_failing_atc.exists()  # it did run
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


# ------------------------------------------------------------------ convert


def test_convert_a_stub_and_a_bundle(stub, stub_bundle, tmp_path, with_fake_atc):
    command = manifest_of(stub_bundle)["atc"]["command"]
    target = tmp_path / "deploy" / "mlp_910b.om"
    result = invoke(["convert", stub, "--soc-version", "Ascend910B", "-o", target, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    expected = [a if not a.startswith("--soc_version=") else "--soc_version=Ascend910B" for a in command]
    assert expected != command and payload["command"] == expected
    assert with_fake_atc.read_text().splitlines() == expected[1:]
    assert target.read_bytes().startswith(b"FAKE-OM ") and payload["output"] == str(target)
    assert (tmp_path / "deploy" / "mlp_910b.atc.log").read_text().count("ATC run success") == 1
    assert {p.name for p in target.parent.iterdir()} == {"mlp_910b.om", "mlp_910b.atc.log"}  # no work dir left

    again = invoke(["convert", stub, "--soc-version", "Ascend910B", "-o", target])
    assert again.exit_code == 2 and "--overwrite" in again.stderr

    bundle = tmp_path / "mlp_om"
    shutil.copytree(stub_bundle, bundle)
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    result = invoke(["convert", bundle])
    assert result.exit_code == 0, result.output
    assert with_fake_atc.read_text().splitlines() == command[1:]
    assert (tmp_path / "mlp_om.om").read_bytes().startswith(b"FAKE-OM ")
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before  # the input is untouched


def test_convert_takes_the_articles_model_and_output_flags(stub, tmp_path, with_fake_atc):
    """The articles' `atc convert --model X --output Y.om` (atc has no convert subcommand) as
    `cann-export convert --model X --output Y.om`."""
    target = tmp_path / "model.om"
    result = invoke(["convert", "--model", stub, "--output", target, "--soc-version", "Ascend910B"])
    assert result.exit_code == 0, result.output
    assert target.read_bytes().startswith(b"FAKE-OM ")
    missing = invoke(["convert", "--output", target])
    assert missing.exit_code == 2 and "--model ARTIFACT" in missing.stderr


def test_convert_without_atc_says_how_to_get_it(stub, no_atc, tmp_path):
    result = invoke(["convert", stub, "-o", tmp_path / "x.om"])
    assert result.exit_code == 2
    assert "atc" in result.stderr and "set_env.sh" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "x.om").exists()


def test_convert_with_failing_atc_reports_its_error(stub, tmp_path, with_failing_atc):
    target = tmp_path / "x.om"
    result = invoke(["convert", stub, "-o", target, "--json"])
    assert result.exit_code == 3
    error = json.loads(result.stdout)["error"]
    assert error["stage"] == "convert" and ERROR_LINE in error["message"] and "exit 1" in error["message"]
    assert ERROR_LINE in result.stderr and "Traceback" not in result.output
    assert not target.exists()
    assert ERROR_LINE in (tmp_path / "x.atc.log").read_text()  # the log is kept for the post-mortem
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_atc_error_text_prefers_error_codes():
    log = ("ATC start working now, please wait for a moment.\n"
           "ATC run failed, Please check the detail log, Try 'atc --help' for more information\n"
           "E19010: No parser is registered for Op [/Foo, optype [ai.onnx::17::Foo]].\n"
           "        Solution: Check the version of the installation package and reinstall the package.\n"
           "        TraceBack (most recent call last):\n"
           "        OpParserFactory::CreateOpParser: Op type Foo has no parser[FUNC:CreateOpParser]\n")
    text = om.atc_error_text(log)
    assert text.startswith("E19010: No parser is registered for Op [/Foo") and "Solution" in text
    assert "please wait" not in text
    assert om.atc_error_text("line one\n\nSegmentation fault (core dumped)\n").endswith(
        "Segmentation fault (core dumped)")
