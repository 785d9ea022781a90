"""A multi-graph bundle as one file (`-o gpt2.zip`): the bundle directory zipped (bundle/single_file.py), read back
by validate, inspect, convert and the zoo through the same bounded unpacking as a single-graph `x.zip`; a zip
with a member its manifest does not list, or a changed graph, is refused naming the zip."""
import json
import os
import shutil
import zipfile

import pytest
from click.testing import CliRunner
from helpers.hf_models import tiny_decoder_gpt2

import cann_export
from cann_export.cli.main import cli

TASK = ["--task", "text-generation-with-past"]  # a defaulted task into one file is refused (it held one graph)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny GPT-2 directory exported as text-generation-with-past (atc_ready) into gpt2.zip, and the same into a
    directory (the zip must hold exactly that bundle)."""
    root = tmp_path_factory.mktemp("multizip")
    tiny_decoder_gpt2(n_positions=32).save_pretrained(root / "gpt2-dir")
    for out in ("gpt2.zip", "gpt2-bundle"):
        run = CliRunner().invoke(cli, [str(root / "gpt2-dir"), "-o", str(root / out), "--json", *TASK],
                                 catch_exceptions=False)
        assert run.exit_code == 0, run.output
    return root


def _members(path):
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def test_the_zip_is_the_bundle_directory(exported):
    zipped = _members(exported / "gpt2.zip")
    on_disk = sorted(p.relative_to(exported / "gpt2-bundle").as_posix()
                     for p in (exported / "gpt2-bundle").rglob("*") if p.is_file())
    assert sorted(zipped) == on_disk
    assert {"components/prefill/model.onnx", "components/decode/model.onnx", "atc/convert.sh",
            "hf/config.json"} <= set(zipped)
    manifest = json.loads(zipped["manifest.json"])
    assert manifest["schema"] == "cann-export/bundle/2" and manifest["parity"]["passed"] is True
    assert not [p for p in exported.iterdir() if ".cann-tmp-" in p.name]  # no staging left behind


def test_validate_and_inspect_read_the_zip(exported):
    report = cann_export.validate(exported / "gpt2.zip")
    assert report["passed"] and set(report["components"]) == {"prefill", "decode"}
    shown = cann_export.inspect(exported / "gpt2.zip")
    assert shown["kind"] == "multi-graph" and shown["path"] == str(exported / "gpt2.zip")
    assert shown["components"]["decode"]["path"] == str(exported / "gpt2.zip" / "components" / "decode")
    run = CliRunner().invoke(cli, ["validate", str(exported / "gpt2.zip")])
    assert run.exit_code == 0 and "2 graphs, parity passed" in run.output, run.output


def test_convert_writes_one_om_per_graph_beside_the_zip(exported, tmp_path, monkeypatch):
    from helpers.fake_atc import fake_atc, path_without_atc

    from cann_export.hooks.manager import get_plugin_manager

    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_atc(tmp_path / "bin", tmp_path / "argv")),
                                                path_without_atc()]))
    bundle = tmp_path / "gpt2.zip"
    shutil.copy(exported / "gpt2.zip", bundle)
    run = CliRunner().invoke(cli, ["convert", str(bundle), "--json"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    result = json.loads(run.stdout)
    assert result["input"] == str(bundle) and result["output"] == str(tmp_path / "gpt2_om")
    assert sorted(p.name for p in (tmp_path / "gpt2_om").glob("*.om")) == ["decode.om", "prefill.om"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("cann-export-unpacked")] == []


def test_the_zoo_publishes_the_zip_as_the_bundle(exported, tmp_path):
    from cann_export.model_zoo import zoo_api as zoo

    published = zoo.publish(str(exported / "gpt2.zip"), name="gpt2-zip", zoo=str(tmp_path / "zoo"))
    assert published["targets"] == ["atc_ready-Ascend310P3-force_fp16"]  # the default SoC and precision
    loaded = zoo.load_model("gpt2-zip", framework="onnx", zoo=str(tmp_path / "zoo"))
    assert cann_export.validate(loaded)["passed"] is True


def test_report_of_a_zipped_multi_graph_bundle_is_one_page(exported, tmp_path):
    from cann_export.report.write_report import regenerate

    result = regenerate(exported / "gpt2.zip", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert result["passed"] and result["layers"] > 0
    assert "<h1>gpt2 &middot; component <code>prefill</code>" in page and "component <code>decode</code>" in page
    assert [p.name for p in exported.iterdir() if p.name.endswith(".html")] == []  # nothing beside the zip either


def _rezip(source, target, edit):
    members = _members(source)
    edit(members)
    with zipfile.ZipFile(target, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return target


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update({"components/decode/extra.py": b"import os"}), "which its manifest's file table does not"),
    (lambda m: m.update({"components/decode/model.onnx": m["components/decode/model.onnx"][:-8] + b"\0" * 8}),
     "components/decode/model.onnx"),
    (lambda m: m.pop("components/prefill/manifest.json"), "components/prefill/manifest.json"),
])
def test_a_changed_zip_is_refused_naming_it(exported, tmp_path, edit, words):
    bad = _rezip(exported / "gpt2.zip", tmp_path / "bad.zip", edit)
    for command in ("validate", "inspect"):
        run = CliRunner().invoke(cli, [command, str(bad)])
        assert run.exit_code == 2, run.output
        assert words in run.output and str(bad) in run.output and "Traceback" not in run.output, run.output
        assert "cann-export-unpacked" not in run.output  # errors name the zip, not the temporary directory


def test_rerun_needs_overwrite_and_replaces_only_the_zip(exported, tmp_path):
    target = tmp_path / "gpt2.zip"
    shutil.copy(exported / "gpt2.zip", target)
    before = target.read_bytes()
    run = CliRunner().invoke(cli, [str(exported / "gpt2-dir"), "-o", str(target), *TASK])
    assert run.exit_code == 2 and "--overwrite" in run.output and target.read_bytes() == before, run.output
    run = CliRunner().invoke(cli, [str(exported / "gpt2-dir"), "-o", str(target), "--overwrite", *TASK,
                                   "--junit", str(tmp_path / "junit.xml")])  # CI reports read the zip's manifests
    assert run.exit_code == 0, run.output
    assert cann_export.validate(target)["passed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.zip", "junit.xml"]
    junit = (tmp_path / "junit.xml").read_text()
    assert 'classname="cann-export.gpt2_zip.prefill"' in junit and 'classname="cann-export.gpt2_zip.decode"' in junit


def test_a_defaulted_task_into_one_file_asks_for_the_task(exported, tmp_path):
    """gpt2.zip held one graph before the with-past default: the several graphs need --task."""
    run = CliRunner().invoke(cli, [str(exported / "gpt2-dir"), "-o", str(tmp_path / "gpt2.zip")])
    assert run.exit_code == 2 and "--task text-generation-with-past for its graphs in that one file" in run.output
    assert list(tmp_path.iterdir()) == []


def test_a_graph_suffix_is_still_refused_for_several_graphs(exported, tmp_path):
    run = CliRunner().invoke(cli, [str(exported / "gpt2-dir"), "-o", str(tmp_path / "gpt2.onnx")])
    assert run.exit_code == 2 and "--task text-generation" in run.output, run.output
    run = CliRunner().invoke(cli, [str(exported / "gpt2-dir"), "--task", "text-generation-with-past",
                                   "-o", str(tmp_path / "gpt2.onnx")])
    assert run.exit_code == 2 and "or one file named .zip" in run.output, run.output
    assert list(tmp_path.iterdir()) == []
