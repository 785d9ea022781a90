"""Every field of a multi-graph bundle's top-level manifest.json is one its writer (bundle/multi_write.py
build_manifest, export_plan's sandbox record) could have produced: strict JSON (no NaN / Infinity, no key twice),
allow-listed names, each value's type, and every value that can be re-derived from the components' own manifests
(atc.soc_version, atc.script, provenance, input and output names, parity names, file paths, whether a sandbox
record belongs there) re-derived. Any edit is refused by validate and inspect (exit 2) naming the field, never
a traceback."""
from __future__ import annotations

import json
import shutil
import zipfile

import pytest
from click.testing import CliRunner
from helpers.hf_models import tiny_decoder_gpt2

import cann_export
from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import ValidateError


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A GPT-2 bundle exported from the in-memory model (no sandbox record, no hf/ files) and one exported from
    its save_pretrained directory (the load's sandbox record, hf/config.json)."""
    root = tmp_path_factory.mktemp("manifest-fields")
    model = tiny_decoder_gpt2()
    api.export_multi(model, root / "gpt2", num_random_inputs=1)
    model.save_pretrained(root / "gpt2-dir")
    api.export_multi(str(root / "gpt2-dir"), root / "gpt2-from-dir", num_random_inputs=1)
    return {"memory": root / "gpt2", "directory": root / "gpt2-from-dir"}


def _json(edit):
    def text(raw):
        manifest = json.loads(raw)
        edit(manifest)
        return json.dumps(manifest, indent=2)

    return text


def _flip_kind(m):
    m["sandbox"]["kind"] = "none" if m["sandbox"]["kind"] != "none" else "landlock+seccomp"


def _denies():
    from cann_export.pipeline.sandboxed_directory import DENIES

    return list(DENIES)


EDITS = {
    "soc_version changed": ("memory", _json(lambda m: m["atc"].update(soc_version="Ascend910B")), "atc.soc_version"),
    "soc_version with an option": ("memory", _json(lambda m: m["atc"].update(
        soc_version="Ascend310P3 --insert_op_conf=/etc/passwd")), "atc.soc_version"),
    "atc.script outside": ("memory", _json(lambda m: m["atc"].update(script="../../../tmp/evil.sh")), "atc.script"),
    "atc a string": ("memory", _json(lambda m: m.update(atc="atc/convert.sh")), "atc: a str"),
    "atc removed": ("memory", _json(lambda m: m.pop("atc")), "manifest.json atc: missing"),
    "atc.precision added": ("memory", _json(lambda m: m["atc"].update(precision_mode="force_fp16")),
                            "'precision_mode'"),
    "sandbox added": ("memory", _json(lambda m: m.update(sandbox={"kind": "none", "reason": "turned off"})),
                      "manifest.json sandbox"),
    "provenance a list": ("memory", _json(lambda m: m.update(provenance=["cann-export"])), "provenance: not an object"),
    "provenance changed": ("memory", _json(lambda m: m["provenance"].update(tool="cann-export 9.9")),
                           "manifest.json provenance"),
    "provenance removed": ("memory", _json(lambda m: m.pop("provenance")), "provenance: missing"),
    "unknown field": ("memory", _json(lambda m: m.update(extra={"a": 1})), "'extra'"),
    "unknown field NaN": ("memory", lambda raw: raw.replace('"schema"', '"extra": NaN, "schema"', 1), "NaN"),
    "Infinity": ("memory", lambda raw: raw.replace('"schema"', '"extra": -Infinity, "schema"', 1), "Infinity"),
    "duplicate key": ("memory", lambda raw: raw.replace('"schema"', '"format": "onnx", "schema"', 1),
                      "'format' appears twice"),
    "component field": ("memory", _json(lambda m: m["components"][0].update(trusted=True)), "'trusted'"),
    "connection field": ("memory", _json(lambda m: m["connections"][0]["to"].update(shape=[1])), "'shape'"),
    "parity field": ("memory", _json(lambda m: m["parity"].update(device=True)), "'device'"),
    "parity name": ("memory", _json(lambda m: m["parity"]["components"].update(extra=True)), "parity.components"),
    "inputs reordered": ("memory", _json(lambda m: m["components"][1]["inputs"].reverse()),
                         "components[decode].inputs"),
    "file entry field": ("memory", _json(lambda m: m["files"]["atc/convert.sh"].update(mode=493)), "'mode'"),
    "stray file listed": ("memory", _json(lambda m: m["files"].update({"run.sh": m["files"]["atc/convert.sh"]})),
                          "files['run.sh']"),
    "precision_fix forged": ("memory", _json(lambda m: m.update(precision_fix={"decode": {"fixed": True}})),
                             "manifest.json precision_fix"),
    "precision_fix a string": ("memory", _json(lambda m: m.update(precision_fix="none")),
                               "manifest.json precision_fix"),
    "sandbox.kind forged": ("directory", _json(_flip_kind), "sandbox"),
    "sandbox a string": ("directory", _json(lambda m: m.update(sandbox="none")), "sandbox"),
    "sandbox a list": ("directory", _json(lambda m: m.update(sandbox=[])), "sandbox"),
    "sandbox removed": ("directory", _json(lambda m: m.pop("sandbox")), "manifest.json sandbox: missing"),
    "sandbox other kind": ("directory", _json(lambda m: m.update(sandbox={"kind": "seatbelt"})), "sandbox"),
    "sandbox kind a list": ("directory", _json(lambda m: m.update(sandbox={"kind": []})), "sandbox"),  # was exit 3
    "sandbox abi a bool": ("directory", _json(lambda m: m.update(sandbox={
        "kind": "landlock+seccomp", "landlock_abi": True, "denies": _denies()})), "sandbox.landlock_abi"),
    "sandbox denies less": ("directory", _json(lambda m: m.update(sandbox={
        "kind": "landlock+seccomp", "landlock_abi": 3, "denies": _denies()[1:]})), "sandbox.denies"),
    "sandbox extra field": ("directory", _json(lambda m: m.update(sandbox={
        "kind": "none", "reason": "turned off", "landlock_abi": 3})), "'landlock_abi'"),
    "sandbox empty reason": ("directory", _json(lambda m: m.update(sandbox={"kind": "none", "reason": ""})),
                             "sandbox.reason"),
}


def _edited(bundles, tmp_path, which, edit):
    copy = tmp_path / "copy"
    shutil.copytree(bundles[which], copy)
    f = copy / "manifest.json"
    f.write_text(edit(f.read_text(encoding="utf-8")), encoding="utf-8")
    return copy


def _refused(path, words):
    for command in ("validate", "inspect"):
        res = CliRunner().invoke(cli, [command, str(path)])
        out = " ".join(res.output.split())
        assert res.exit_code == 2, (command, res.output)
        assert "Traceback" not in res.output and "AttributeError" not in res.output, res.output
        assert "manifest.json" in out and words in out, (command, out)


def test_the_writers_bundles_validate(bundles):
    for path in bundles.values():
        assert cann_export.validate(path)["passed"]
        shown = cann_export.inspect(path)
        assert shown["kind"] == "multi-graph" and shown["atc_script"] == "atc/convert.sh"
    manifest = json.loads((bundles["directory"] / "manifest.json").read_text())
    assert manifest["sandbox"]["kind"] in ("none", "landlock+seccomp") and "hf/config.json" in manifest["files"]


def test_the_sandbox_denies_lists_agree():
    """Both confined runs (one file, a model directory) record the one list the manifest schemas check."""
    from cann_export.pipeline.sandboxed_directory import DENIES as multi
    from cann_export.pipeline.sandboxed_file import DENIES as single

    assert list(multi) == list(single)


@pytest.mark.parametrize("name", list(EDITS))
def test_an_edited_top_level_manifest_is_refused(bundles, tmp_path, name):
    which, edit, words = EDITS[name]
    copy = _edited(bundles, tmp_path, which, edit)
    _refused(copy, words)
    with pytest.raises(ValidateError):
        cann_export.validate(copy)
    with pytest.raises(ValidateError):
        cann_export.inspect(copy)


@pytest.mark.parametrize("name", ["atc a string", "unknown field NaN", "duplicate key"])
def test_an_edited_top_level_manifest_in_a_zip_is_refused(bundles, tmp_path, name):
    which, edit, words = EDITS[name]
    copy = _edited(bundles, tmp_path, which, edit)
    target = tmp_path / "bad.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for p in sorted(copy.rglob("*")):
            if p.is_file():
                zf.writestr(zipfile.ZipInfo(p.relative_to(copy).as_posix(), (1980, 1, 1, 0, 0, 0)), p.read_bytes())
    _refused(target, words)


def test_a_component_manifest_is_checked_by_the_one_graph_schema(bundles, tmp_path):
    """A bundle is a set of one-graph bundles: each component's manifest.json is checked by the schema a single
    graph's is (manifest_schema.graph_problems) in check_multi, the check every reader of the bundle shares
    (cann_export.load, report, lint, the zoo): a field the writer never writes there is refused even when the
    top level's digests were made to match it."""
    from cann_export.bundle.multi_check import check_multi
    from cann_export.fs import digests

    copy = tmp_path / "copy"
    shutil.copytree(bundles["memory"], copy)
    own = copy / "components" / "decode" / "manifest.json"
    manifest = json.loads(own.read_text(encoding="utf-8"))
    manifest["trusted"] = True
    own.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    top = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    sha = digests.sha256_file(own)
    next(c for c in top["components"] if c["name"] == "decode")["manifest_sha256"] = sha
    top["files"]["components/decode/manifest.json"] = {"sha256": sha, "size": own.stat().st_size}
    (copy / "manifest.json").write_text(json.dumps(top, indent=2), encoding="utf-8")
    _, diffs = check_multi(copy)
    assert any("components/decode/manifest.json: not one graph's manifest" in d and "'trusted'" in d
               for d in diffs), diffs
    res = CliRunner().invoke(cli, ["validate", str(copy)])
    assert res.exit_code == 2 and "'trusted'" in res.output and "Traceback" not in res.output, res.output
