"""Tampered, malformed and hostile bundles: every verdict is re-derived, never read back.

Each case edits a real exported bundle the way an attacker or a careless user would (re-hashing the file
table where that hides the edit) and asserts a refusal that names the difference, the right exit code, no
internal error, and that ATC (a fake `atc` recording its argv) never ran a string the manifest provided.
"""
import json
import os
import shutil
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers.fake_atc import fake_atc, path_without_atc
from helpers.toy_models import make_mlp
from safetensors.numpy import load_file, save_file

import cann_export
from cann_export.bundle import om_stub
from cann_export.bundle import rederive as bundle_check
from cann_export.cli.main import cli
from cann_export.errors import ExportError, ValidateError
from cann_export.fs import digests
from cann_export.hooks.manager import get_plugin_manager


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A good atc_ready bundle (license metadata, a fusion_switch hint), another model's bundle, and an
    om-stub, all written without atc on PATH."""
    root = tmp_path_factory.mktemp("hostile")
    x = (torch.randn(2, 12),)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        good = cann_export.export(make_mlp(), root / "good", "atc_ready", example_inputs=x,
                                  metadata={"license": "MIT"},
                                  atc_hints={"fusion_switch": {"ConvToFullyConnectionFusionPass": "off"}})
        time.sleep(1.1)  # created_utc is to the second: the other export's provenance differs from good's
        other = cann_export.export(make_mlp(hidden=16), root / "other", "atc_ready", example_inputs=x)
        stub = cann_export.export(make_mlp(), root / "stub", "om", example_inputs=x)
    assert good.ok and other.ok and stub.ok
    return root


@pytest.fixture
def bundle(exported, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(exported / "good", path)
    return path


@pytest.fixture
def stub(exported, tmp_path):
    path = tmp_path / "m.om"
    shutil.copy2(exported / "stub" / "model.om", path)
    return path


@pytest.fixture
def recording_atc(monkeypatch, tmp_path):
    argv = tmp_path / "argv.txt"
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_atc(tmp_path / "bin", argv)), path_without_atc()]))
    return argv


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def write_manifest(path: Path, data: dict, rehash: bool = True) -> None:
    if rehash:  # what an attacker does to get past the file table
        data["files"] = digests.file_table(path)
    (path / "manifest.json").write_text(json.dumps(data))


def edit(path: Path, change, rehash: bool = True) -> None:
    data = manifest(path)
    change(data)
    write_manifest(path, data, rehash)


def refused(args, *words, code=2):
    result = invoke(args)
    assert result.exit_code == code, (args, result.output)
    assert "Traceback" not in result.output and "[internal]" not in result.output, result.output
    for w in words:
        assert w in result.stderr, (w, result.stderr)
    return result


def all_commands_refuse(path: Path, *words, tmp: Path):
    for command in (["validate", path], ["inspect", path], ["lint", path], ["convert", path, "-o", tmp / "x.om"]):
        refused(command, *words)
    assert not (tmp / "x.om").exists()


# ------------------------------------------------------------------ verdicts and claims


def test_the_untouched_bundle_validates(bundle):
    result = invoke(["validate", bundle, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["ok"] is True and payload["manifest_sha256"] == digests.sha256_file(bundle / "manifest.json")


def test_flipped_verdict_is_a_difference(bundle, recording_atc, tmp_path):
    edit(bundle, lambda m: m["parity"].update(passed=False))
    result = refused(["validate", bundle, "--json"], "parity.passed: the manifest says False, re-derived True")
    assert any("parity.passed" in d for d in json.loads(result.stdout)["error"]["differences"])


def _fail_the_reference(path: Path) -> None:
    """Make the stored reference disagree with the graph (as a wrong export would), re-hashed."""
    expected = path / "parity" / "expected.safetensors"
    data = load_file(str(expected))
    from safetensors import safe_open

    with safe_open(str(expected), "np") as f:
        meta = f.metadata()
    save_file({k: (v + 1.0).astype(np.float32) for k, v in data.items()}, str(expected), metadata=meta)


def test_a_widened_tolerance_does_not_pass(bundle, tmp_path):
    _fail_the_reference(bundle)
    edit(bundle, lambda m: (m["parity"].update(passed=True), m["parity"]["tolerance"].update(atol=1e9, rtol=1e9,
                                                                                            min_cosine=-1.0)))
    result = refused(["validate", bundle], "parity.tolerance.atol",
                     "parity.passed: the manifest says True, re-derived False")
    assert "1000000000.0" in result.stderr
    with pytest.raises(bundle_check.BundleMismatchError) as e:
        cann_export.validate(bundle)
    assert any(d.startswith("parity.passed") for d in e.value.differences)


def test_a_widened_tolerance_alone_is_named_and_an_explicit_one_is_used(bundle):
    edit(bundle, lambda m: m["parity"]["tolerance"].update(atol=1e9))
    refused(["validate", bundle], "parity.tolerance.atol: the manifest records 1000000000.0, validate used 0.0001")
    assert invoke(["validate", bundle, "--atol", "1e9"]).exit_code == 0  # the user's explicit choice


def test_license_and_soc_edits_are_named(bundle, tmp_path, recording_atc):
    edit(bundle, lambda m: (m["metadata"].update(license="Apache-2.0"), m["atc"].update(soc_version="Ascend910B")))
    all_commands_refuse(bundle, "metadata.license: the manifest says 'Apache-2.0'", "atc/convert.sh",
                        "atc.command", tmp=tmp_path)
    assert not recording_atc.exists()


def test_a_swapped_graph_with_a_rehashed_table_is_named(bundle, exported, tmp_path, recording_atc):
    shutil.copy2(exported / "other" / "model.onnx", bundle / "model.onnx")
    write_manifest(bundle, manifest(bundle))
    result = refused(["validate", bundle, "--json"])
    differences = json.loads(result.stdout)["error"]["differences"]
    assert any(d.startswith("provenance.created_utc") for d in differences), differences
    assert any(d.startswith("metadata.license") for d in differences), differences
    all_commands_refuse(bundle, "provenance.created_utc", tmp=tmp_path)
    assert not recording_atc.exists()


@pytest.mark.parametrize("where", ["convert.sh", "manifest", "cfg"])
def test_an_edited_atc_command_never_reaches_atc(bundle, tmp_path, recording_atc, where):
    if where == "convert.sh":
        script = bundle / "atc" / "convert.sh"
        script.write_text(script.read_text().replace("--output=model", "--output=../../x"))
        write_manifest(bundle, manifest(bundle))
        words = ("atc/convert.sh: differs",)
    elif where == "manifest":
        edit(bundle, lambda m: m["atc"]["command"].extend(["--output=../../x", "--log=debug"]))
        words = ("atc.command: the manifest says", "--output=../../x")
    else:
        (bundle / "atc" / "fusion_switch.cfg").write_text('{"Switch": {"GraphFusion": {"ALL": "off"}}}')
        write_manifest(bundle, manifest(bundle))
        words = ("atc/fusion_switch.cfg: differs",)
    all_commands_refuse(bundle, *words, tmp=tmp_path)
    assert not recording_atc.exists()


def test_convert_runs_the_command_it_renders(bundle, tmp_path, recording_atc):
    data = manifest(bundle)
    data["atc"]["command"] = None  # whatever the manifest holds there is never run
    del data["atc"]["command"]
    write_manifest(bundle, data)
    result = invoke(["convert", bundle, "-o", tmp_path / "x.om", "--json"])
    assert result.exit_code == 0, result.output
    argv = recording_atc.read_text().splitlines()
    assert argv == json.loads(result.stdout)["command"][1:]
    assert "--output=model" in argv and "--model=model.onnx" in argv and "--soc_version=Ascend310P3" in argv
    assert "--fusion_switch_file=atc/fusion_switch.cfg" in argv


def test_a_soc_override_must_look_like_a_soc(bundle, tmp_path, recording_atc):
    refused(["convert", bundle, "--soc-version", "Ascend910B --output=../x", "-o", tmp_path / "x.om"], "Ascend SoC")
    edit(bundle, lambda m: m["atc"].update(soc_version="Ascend910B --output=/tmp/x"))
    refused(["convert", bundle, "-o", tmp_path / "x.om"], "do not validate")
    assert not recording_atc.exists()


def test_an_unknown_hint_in_the_manifest_is_refused(bundle, tmp_path, recording_atc):
    edit(bundle, lambda m: m["atc"]["hints"].update(output="../../x"))
    all_commands_refuse(bundle, "unknown ATC hint(s) output", tmp=tmp_path)


def test_external_data_outside_the_table_is_refused(bundle, tmp_path):
    import onnx

    model = onnx.load(str(bundle / "model.onnx"))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../../victim.bin")
    onnx.save_model(model, str(bundle / "model.onnx"))
    write_manifest(bundle, manifest(bundle))
    refused(["validate", bundle], "external data from '../../victim.bin'")



@pytest.mark.parametrize("plant", ["extra.sh", "atc/extra.cfg", "link"])
def test_a_file_outside_the_table_in_a_bundle_directory_is_refused(bundle, tmp_path, plant):
    """The rule of a single-file bundle and of a multi-graph bundle, for a single graph's directory too: before,
    `validate` passed a directory holding an unlisted `extra.sh`."""
    if plant == "link":
        (bundle / "notes").symlink_to("/etc")
    else:
        (bundle / plant).write_text("touch MARK\n")
    shown = "notes" if plant == "link" else plant
    all_commands_refuse(bundle, "file table does not list", shown, tmp=tmp_path)
    from cann_export.model_zoo import publish

    with pytest.raises(ExportError, match="file table does not list"):
        publish(model=str(bundle), name="planted", zoo=str(tmp_path / "zoo"))

# ------------------------------------------------------------------ malformed manifests


@pytest.mark.parametrize("damage, words", [
    (lambda m: m.pop("parity"), "parity: the parity section is missing"),
    (lambda m: m.update(files=["model.onnx"]), "files: the file table is missing or not an object"),
    (lambda m: m["files"].update({"model.onnx": {"sha256": "../../x", "size": 1}}), "not a {sha256, size} entry"),
    (lambda m: m["files"].update({"model.onnx": "abc"}), "not a {sha256, size} entry"),
    (lambda m: m["model"].update(inputs="x"), "model.inputs"),
    (lambda m: m["model"].update(file="../model.onnx"), "model.file"),
    (lambda m: m.pop("model"), "model: missing"),
    (lambda m: m["parity"].update(passed="yes"), "parity.passed"),
    (lambda m: m["atc"].update(command="atc --output=/x"), "atc.command: not a list"),
    (lambda m: m["atc"].update(hints=[]), "atc.hints"),
    (lambda m: m["metadata"].update(license=3), "metadata"),
])
def test_a_malformed_manifest_is_a_refusal(bundle, tmp_path, recording_atc, damage, words):
    edit(bundle, damage, rehash=False)
    all_commands_refuse(bundle, "manifest.json is malformed", words, tmp=tmp_path)
    assert not recording_atc.exists()


@pytest.mark.parametrize("text, words", [
    ('{"schema": "cann-export/manifest/1", "format": "atc_', "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ("", "not valid JSON"),
    ('{"size": ' + "9" * 5000 + "}", "not valid JSON"),  # an int past Python's digit limit: ValueError
    ('{"files": {"../../../etc/passwd": {"sha256": "' + "0" * 64 + '", "size": 1}}}', "malformed"),
])
def test_a_truncated_or_foreign_manifest_is_a_refusal(bundle, tmp_path, text, words):
    (bundle / "manifest.json").write_text(text)
    all_commands_refuse(bundle, words, tmp=tmp_path)


def test_a_file_table_path_out_of_the_bundle_is_never_touched(bundle, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    data = manifest(bundle)
    data["files"]["../victim.txt"] = {"sha256": digests.sha256_file(victim), "size": victim.stat().st_size}
    write_manifest(bundle, data, rehash=False)
    refused(["validate", bundle], "'../victim.txt': not a path inside the bundle (refused)")
    assert victim.read_text() == "keep me"


def test_expect_sha256_pins_the_manifest(bundle):
    digest = digests.sha256_file(bundle / "manifest.json")
    info = json.loads(invoke(["inspect", bundle, "--json"]).stdout)
    assert info["manifest_sha256"] == digest
    assert invoke(["validate", bundle, "--expect-sha256", digest]).exit_code == 0
    refused(["validate", bundle, "--expect-sha256", "0" * 64], f"manifest.json has sha256 {digest}")
    refused(["validate", bundle, "--expect-sha256", "nothex"], "64 hex digits")


# ------------------------------------------------------------------ om-stubs


@pytest.mark.parametrize("offset, value", [
    (8, struct.pack("<I", 0x20000000)),  # version
    (84, b"Other\0"),  # name
    (116, struct.pack("<I", 7)),  # ops
    (156, b"Ascend910B\0"),  # platform_version
    (81, b"\1"),  # is_checksum
    (177, b"\1"),  # reserved
])
def test_an_edited_stub_header_field_is_refused(stub, tmp_path, recording_atc, offset, value):
    raw = bytearray(stub.read_bytes())
    raw[offset:offset + len(value)] = value
    stub.write_bytes(bytes(raw))
    for command in (["validate", stub], ["inspect", stub], ["lint", stub], ["convert", stub, "-o", tmp_path / "x.om"]):
        refused(command, "sha256", str(stub))
    assert not recording_atc.exists()


def test_a_re_digested_stub_with_another_platform_is_named(stub, tmp_path):
    raw = bytearray(stub.read_bytes())
    raw[156:176] = b"Ascend910B".ljust(20, b"\0")
    with open(stub, "rb") as f:
        f.seek(256)
        raw[12:76] = om_stub.header_digest(bytes(raw[:256]), f, len(raw) - 256).encode()
    stub.write_bytes(bytes(raw))
    refused(["validate", stub], "om header platform_version 'Ascend910B' differs from the bundle's soc_version")


def forge_stub(path: Path, members) -> None:
    """An om-stub whose payload holds ``members`` ((ZipInfo, bytes) pairs), with a valid header digest."""
    with open(path, "w+b") as out:
        out.write(b"\0" * 256)
        with zipfile.ZipFile(out, "w") as zf:
            for info, data in members:
                zf.writestr(info, data)
        length = out.tell() - 256
        fields = [om_stub.MAGIC, 256, om_stub.MODEL_VERSION, b"\0" * 64, length, 0, 0, 0, 0, b"x", 0,
                  b"CANN-EXPORT-STUB/2", 0, b"Ascend310P3", 0, b"\0" * 79]
        out.seek(256)
        fields[3] = om_stub.header_digest(om_stub.HEADER.pack(*fields), out, length).encode()
        out.seek(0)
        out.write(om_stub.HEADER.pack(*fields))


def _deflated(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def test_a_zip_bomb_stub_is_refused_before_extraction(tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.om"
    forge_stub(bomb, [(_deflated("manifest.json"), b"{}"), (_deflated("model.onnx.data"), bytes(64 << 20))])
    assert bomb.stat().st_size < 1 << 20
    seen = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: seen.append(a) or pytest.fail("read"))
    for command in (["validate", bomb], ["inspect", bomb], ["lint", bomb]):
        refused(command, "zip bomb", str(bomb))
    assert seen == []


def test_a_member_past_the_cap_and_a_lying_size_are_refused(tmp_path, monkeypatch):
    stored = tmp_path / "big.om"
    forge_stub(stored, [(zipfile.ZipInfo("manifest.json"), b"{}"), (zipfile.ZipInfo("w.bin"), bytes(4096))])
    monkeypatch.setenv("CANN_EXPORT_MAX_UNPACK_BYTES", "1000")
    refused(["validate", stored], "past the 1000-byte cap")
    monkeypatch.delenv("CANN_EXPORT_MAX_UNPACK_BYTES")

    liar = tmp_path / "liar.zip"  # a single-file bundle whose member declares fewer bytes than it holds
    with zipfile.ZipFile(liar, "w") as zf:
        zf.writestr("manifest.json", b"{}")
        zf.writestr(_deflated("model.onnx"), bytes(10_000))
    raw = bytearray(liar.read_bytes())
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # patch the declared size in both headers
        start = 0
        while (at := raw.find(sig, start)) >= 0:
            name_at = at + (30 if sig == b"PK\x03\x04" else 46)
            if raw[name_at:name_at + 10] == b"model.onnx":
                size_at = at + (22 if sig == b"PK\x03\x04" else 24)
                raw[size_at:size_at + 4] = struct.pack("<I", 100)
            start = at + 4
    liar.write_bytes(bytes(raw))
    refused(["validate", liar], str(liar))


def test_unsafe_names_in_an_archive_are_refused(tmp_path):
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("manifest.json", b"{}")
        zf.writestr("../../escaped.txt", b"x")
    refused(["inspect", evil], "unsafe path '../../escaped.txt'")
    assert not (tmp_path.parent / "escaped.txt").exists()


# ------------------------------------------------------------------ single-file artifacts


def test_a_file_path_is_a_file(tmp_path, recording_atc):
    out = tmp_path / "x.pth"
    result = cann_export.export(make_mlp(), out, "atc_ready", example_inputs=(torch.randn(2, 12),))
    assert result.ok and out.is_file() and result.files == [str(out)]
    assert result.manifest_sha256 and result.to_dict()["manifest_sha256"] == result.manifest_sha256
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert digests.sha256_bytes(zf.read("manifest.json")) == result.manifest_sha256
    directory = tmp_path / "x_dir"
    cann_export.export(make_mlp(), directory, "atc_ready", example_inputs=(torch.randn(2, 12),))
    assert names == {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    assert cann_export.validate(out)["passed"] is True
    assert invoke(["validate", out, "--expect-sha256", result.manifest_sha256]).exit_code == 0
    info = json.loads(invoke(["inspect", out, "--json"]).stdout)
    assert info["kind"] == "atc_ready" and info["container"] == "archive" and info["path"] == str(out)
    assert invoke(["lint", out]).exit_code == 0
    converted = invoke(["convert", out, "--json"])
    assert converted.exit_code == 0, converted.output
    assert Path(json.loads(converted.stdout)["output"]) == tmp_path / "x.om"
    assert recording_atc.read_text().splitlines()[0] == "--framework=5"

    refused(["export", "model.pt2", "-o", tmp_path / "y.om"], "--format om")


def test_cli_om_file_with_the_bundle_beside_it(tmp_path, monkeypatch):
    from helpers import files

    monkeypatch.setenv("PATH", path_without_atc())
    model = files.state_dict(tmp_path)
    out = tmp_path / "model.om"
    args = [model, "--model-class", files.MLP_CLASS, "--input-shape", "x:2,12", "--format", "om", "-o", out]
    result = invoke([*args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["om"]["kind"] == "stub" and payload["output"] == str(out)
    assert out.is_file() and om_stub.read_header(out)["stub"]
    beside = tmp_path / "model_bundle"
    assert (beside / "manifest.json").is_file() and not (beside / "model.om").exists()
    assert manifest(beside)["atc"]["om"]["file"] == "../model.om"
    assert payload["manifest_sha256"] == digests.sha256_file(beside / "manifest.json")
    for path in (out, beside):
        assert invoke(["validate", path]).exit_code == 0, path

    text = invoke([*args, "-o", tmp_path / "again.om"])
    assert text.exit_code == 0 and "wrote om-stub" in text.stdout and "not a compiled model" in text.stdout
    assert "om-stub" in invoke(["inspect", out]).stdout

    strict = refused([*args, "-o", tmp_path / "strict.om", "--require-atc"], "--require-atc", "atc", code=3)
    assert not (tmp_path / "strict.om").exists() and not (tmp_path / "strict_bundle").exists()
    assert strict.stderr.count("Traceback") == 0


def test_validate_reports_a_stub_whose_bundle_was_changed_inside(stub, tmp_path):
    """Unpack, edit the manifest's license, re-pack and re-digest: the graph holds no such license."""
    unpacked = tmp_path / "u"
    om_stub.extract_stub(stub, unpacked)
    edit(unpacked, lambda m: m["metadata"].update(license="stolen"))
    om_stub.write_stub(stub, unpacked, "MLP")
    with pytest.raises(ValidateError, match="metadata.license"):
        cann_export.validate(stub)


def test_cli_archive_and_a_compiled_om_file(tmp_path, recording_atc):
    from helpers import files

    model = files.state_dict(tmp_path)
    base = [model, "--model-class", files.MLP_CLASS, "--input-shape", "x:2,12"]
    archive = tmp_path / "x.zip"
    result = invoke([*base, "-o", archive, "--json"])
    assert result.exit_code == 0, result.output
    assert archive.is_file() and json.loads(result.stdout)["files"] == [str(archive)]
    assert invoke(["validate", archive]).exit_code == 0

    out = tmp_path / "deploy.om"
    result = invoke([*base, "--format", "om", "-o", out, "--require-atc", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["om"]["kind"] == "atc" and out.read_bytes().startswith(b"FAKE-OM ")
    beside = tmp_path / "deploy_bundle"
    om = manifest(beside)["atc"]["om"]
    assert om["file"] == "../deploy.om" and om["sha256"] == digests.sha256_file(out)
    assert "model.om" not in manifest(beside)["files"] and not (beside / "model.om").exists()
    assert "atc/atc.log" in manifest(beside)["files"]
    assert invoke(["validate", beside]).exit_code == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_version_1_stub_is_refused_with_the_fix(stub):
    raw = bytearray(stub.read_bytes())
    raw[120:152] = b"CANN-EXPORT-STUB/1".ljust(32, b"\0")
    stub.write_bytes(bytes(raw))
    refused(["inspect", stub], "om-stub version 1", "export it again")


def test_the_stub_inside_an_om_bundle_is_checked(exported, tmp_path):
    bundle = tmp_path / "om"
    shutil.copytree(exported / "stub", bundle)
    raw = bytearray((bundle / "model.om").read_bytes())
    raw[156:176] = b"Ascend910B".ljust(20, b"\0")
    (bundle / "model.om").write_bytes(bytes(raw))
    data = manifest(bundle)
    data["files"] = digests.file_table(bundle)
    data["atc"]["om"]["sha256"] = digests.sha256_file(bundle / "model.om")
    write_manifest(bundle, data, rehash=False)
    refused(["validate", bundle], "model.om: om-stub header or payload does not match the sha256")


# ------------------------------------------------------------------ multi-graph bundles: every file listed (issue 41)


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """A tiny GPT-2 directory exported once as text-generation-with-past (prefill + decode, hf/ carried)."""
    from helpers.hf_models import tiny_decoder_gpt2

    root = tmp_path_factory.mktemp("multi")
    tiny_decoder_gpt2(n_positions=32).save_pretrained(root / "gpt2-dir")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        run = invoke([root / "gpt2-dir", "-o", root / "bundle", "--task", "text-generation-with-past", "-q"])
    assert run.exit_code == 0, run.output
    assert (root / "bundle" / "hf" / "config.json").is_file()
    return root / "bundle"


def _drop_from_table(bundle: Path, rel: str) -> None:
    data = manifest(bundle)
    data["files"].pop(rel)
    (bundle / "manifest.json").write_text(json.dumps(data))


MULTI_CASES = {
    "unlisted hf/extra.sh": (lambda b: (b / "hf" / "extra.sh").write_text("touch MARK\n"),
                             "hf/extra.sh: not in the top-level file table"),
    "unlisted top-level file": (lambda b: (b / "run.sh").write_text("touch MARK\n"),
                                "run.sh: not in the top-level file table"),
    "hf/config.json out of the table": (lambda b: _drop_from_table(b, "hf/config.json"),
                                        "hf/config.json: not in the top-level file table"),
    "link in hf/": (lambda b: (b / "hf" / "vocab.txt").symlink_to("/etc/hostname"),
                    "hf/vocab.txt: a link inside the bundle"),
    "FIFO in hf/": (lambda b: os.mkfifo(b / "hf" / "pipe"), "hf/pipe: not a regular file"),
}


@pytest.mark.parametrize("case", list(MULTI_CASES))
def test_multi_graph_bundle_with_an_unlisted_file_is_refused_by_validate_and_the_zoo(multi, tmp_path, case):
    tamper, words = MULTI_CASES[case]
    bundle = tmp_path / "b"
    shutil.copytree(multi, bundle)
    assert invoke(["validate", bundle]).exit_code == 0
    tamper(bundle)
    result = invoke(["validate", bundle])
    assert result.exit_code == 2 and "[validate]" in result.stderr, result.output
    assert words in " ".join(result.stderr.split()), result.stderr
    zoo = tmp_path / "zoo"
    result = invoke(["zoo", "publish", bundle, "--name", "m", "--zoo", zoo])
    assert result.exit_code == 2 and "[zoo]" in result.stderr and "[internal]" not in result.stderr, result.output
    assert words in " ".join(result.stderr.split()), result.stderr
    assert not (zoo / "models" / "m").exists()
