"""Hostile files: pickles inside .pt2 archives, edited zoo manifests, paths that leave their root."""
import io
import json
import os
import zipfile

import pytest
import torch
from click.testing import CliRunner
from helpers import files

from cann_export.cli.main import _register_plugin_commands, cli

_register_plugin_commands()  # zoo, convert, lint: the commands plugins add (main() does this)


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_pt2(tmp_path, marker):
    good = files.pt2(tmp_path)
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("sample_inputs/model.pt"):
                buf = io.BytesIO()
                torch.save({"payload": Evil(marker)}, buf)
                data = buf.getvalue()
            dst.writestr(item, data)
    return evil


def test_pickle_inside_pt2_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = evil_pt2(tmp_path, marker)
    export = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o")])
    assert export.exit_code == 2 and "weights-only" in export.stderr and not marker.exists()
    publish = CliRunner().invoke(cli, ["zoo", "publish", str(path), "--name", "evil", "--zoo", str(tmp_path / "z")])
    assert publish.exit_code == 2 and "weights-only" in publish.stderr and not marker.exists()
    assert "Traceback" not in export.output + publish.output


def test_edited_manifest_is_refused(tmp_path):
    from cann.model_zoo import load_model, publish, verify
    from cann_export.model_zoo import zoo_errors

    zoo = tmp_path / "z"
    publish(model=str(files.state_dict(tmp_path)), name="mlp", model_class=files.MLP_CLASS, zoo=str(zoo))
    manifest_path = next(zoo.rglob("manifest.json"))
    manifest = json.loads(manifest_path.read_text())
    manifest["architecture"] = {"kind": "callable", "callable": "os:system", "kwargs": {"command": "true"}}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(zoo_errors.ZooIntegrityError, match="changed after publish"):
        load_model("mlp", zoo=str(zoo))
    report = verify("mlp", zoo=str(zoo))
    assert not report["ok"] and "changed after publish" in report["versions"][0]["problems"][0]


def test_names_with_a_trailing_newline_are_refused(tmp_path):
    result = CliRunner().invoke(cli, ["zoo", "publish", str(files.state_dict(tmp_path)), "--name", "ab\n",
                                      "--model-class", files.MLP_CLASS, "--zoo", str(tmp_path / "z")])
    assert result.exit_code == 2 and "invalid model name" in result.stderr


def test_bundle_file_table_cannot_leave_the_bundle(tmp_path):
    out = tmp_path / "b"
    assert CliRunner().invoke(cli, [str(files.pt2(tmp_path)), "-o", str(out)]).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"]["../../etc/hostname"] = {"sha256": "0" * 64, "size": 1}
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["validate", str(out)])
    assert result.exit_code == 2 and "not a path inside the bundle" in result.stderr
    manifest["files"].pop("../../etc/hostname")
    manifest["atc"]["soc_version"] = "x/../../../escape"
    (out / "manifest.json").write_text(json.dumps(manifest))
    publish = CliRunner().invoke(cli, ["zoo", "publish", str(out), "--name", "b", "--zoo", str(tmp_path / "z")])
    assert publish.exit_code != 0 and not (tmp_path / "escape-force_fp16").exists()



def test_exported_bundles_are_not_private_to_the_exporter(tmp_path):
    out = tmp_path / "b"
    assert CliRunner().invoke(cli, [str(files.pt2(tmp_path)), "-o", str(out)]).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_damaged_stub_payload_names_the_stub(tmp_path):
    from cann_export.bundle import om_stub

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("[1, 2]")
    stub = tmp_path / "x.om"
    om_stub.write_stub(stub, bundle, "x")
    result = CliRunner().invoke(cli, ["validate", str(stub)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(stub) in result.stderr and "cann-export-om" not in result.stderr


def test_lint_reads_stubs_and_checks_bundle_files(tmp_path):
    out = tmp_path / "b"
    assert CliRunner().invoke(cli, [str(files.pt2(tmp_path)), "-o", str(out), "--format", "om"]).exit_code == 0
    assert CliRunner().invoke(cli, ["lint", str(out / "model.om")]).exit_code == 0
    data = bytearray((out / "model.onnx").read_bytes())
    data[-10] ^= 0xFF
    (out / "model.onnx").write_bytes(bytes(data))
    tampered = CliRunner().invoke(cli, ["lint", str(out)])
    assert tampered.exit_code == 2 and "sha256" in tampered.stderr
