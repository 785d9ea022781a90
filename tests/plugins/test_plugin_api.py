"""The public plugin API: a third-party plugin needs only names exported from ``cann_export``; a hookimpl
that implements no hook is refused; a third-party format round-trips through export, validate and inspect
(Python and CLI), which ask the Format what its artifact holds."""
import ast
import json
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

import cann_export
from cann_export import errors, hookimpl
from cann_export.hooks.manager import get_plugin_manager, registry

HELPER = Path(__file__).parents[1] / "helpers" / "thirdparty_plugin.py"


@pytest.fixture
def thirdparty():
    from helpers import thirdparty_plugin

    thirdparty_plugin.EVENTS.clear()
    get_plugin_manager().register(thirdparty_plugin, name="thirdparty")
    yield thirdparty_plugin
    get_plugin_manager().unregister(thirdparty_plugin)


def test_the_third_party_plugin_imports_only_public_names():
    imported = []
    for node in ast.walk(ast.parse(HELPER.read_text())):
        if isinstance(node, ast.Import):
            imported += [(a.name, None) for a in node.names if a.name.split(".")[0] == "cann_export"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cann_export":
            imported += [(node.module, a.name) for a in node.names]
    assert imported, "the helper imports nothing from cann_export: the check below would pass vacuously"
    deeper = [m for m, _ in imported if m != "cann_export"]
    assert not deeper, f"imports below the public API: {deeper}"
    unexported = [n for _, n in imported if n not in cann_export.__all__]
    assert not unexported, f"names cann_export does not export: {unexported}"
    for _, name in imported:
        assert getattr(cann_export, name) is not None


def test_every_exported_name_resolves():
    for name in cann_export.__all__:
        assert getattr(cann_export, name) is not None, name
    assert cann_export.write_atomic.__module__ == "cann_export.fs.atomic"


@pytest.fixture
def misspelled():
    @hookimpl
    def register_formatz(register):  # the typo under test
        raise AssertionError("never called")

    module = types.SimpleNamespace(register_formatz=register_formatz)
    get_plugin_manager().register(module, name="typo-plugin")
    yield
    get_plugin_manager().unregister(module)


def test_a_misspelled_hookimpl_is_an_error(misspelled, tmp_path):
    with pytest.raises(errors.PluginError, match=r"'typo-plugin' implements 'register_formatz'.*did you mean "
                                                 r"'register_formats'"):
        registry()
    from cann_export.cli.main import cli

    (tmp_path / "m.onnx").write_bytes(b"not read: the plugins are checked first")
    res = CliRunner().invoke(cli, ["inspect", str(tmp_path / "m.onnx")])
    assert res.exit_code == 2 and "register_formatz" in res.stderr and "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_misspelled_hookimpl_in_an_entry_point_plugin_fails_at_load(tmp_path, monkeypatch):
    from cann_export.cli.main import cli
    from cann_export.hooks import manager

    pkg = tmp_path / "cannplug_typo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from cann_export import hookimpl\n\n@hookimpl\ndef provenence(ctx):\n"
                                     "    return {}\n")
    dist = tmp_path / "cannplug_typo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cannplug-typo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cann_export]\ntypo = cannplug_typo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "typo")
    monkeypatch.setattr(manager._loaded, "pm", None)
    with pytest.raises(errors.PluginError, match="'typo' implements 'provenence'.*'provenance'"):
        manager.get_plugin_manager()
    assert manager._loaded.pm is None  # nothing half-loaded is kept
    res = CliRunner().invoke(cli, ["plugins"])
    assert res.exit_code == 2 and "error: [plugins]" in res.stderr and "provenence" in res.stderr
    assert "Traceback" not in res.output


def test_a_third_party_format_round_trips(thirdparty, tmp_path):
    """export, validate and inspect (Python and CLI) serve a format the core has never heard of."""
    from cann_export.cli.main import cli

    out = tmp_path / "ops"
    result = cann_export.export(make_mlp(), out, "ops_bundle", example_inputs=torch.randn(2, 12))
    assert result.ok and (out / "ops.txt").is_file() and (out / "manifest.json").is_file()
    body = result.to_dict()
    assert body["ops_listed"] == sum(result.manifest["model"]["ops"].values()) and "om" not in body
    assert result.info().label == "ops bundle"

    report = cann_export.validate(out)
    assert report["passed"] and "ops_bundle.check_artifact" in thirdparty.EVENTS
    info = cann_export.inspect(out)
    assert info["kind"] == "ops_bundle" and info["ops_listed"] == body["ops_listed"]
    assert "atc" not in info  # it holds no ATC options, and nothing pretends it does

    runner = CliRunner()
    res = runner.invoke(cli, ["validate", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"]
    res = runner.invoke(cli, ["inspect", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["ops_listed"] >= 2
    res = runner.invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 0 and f"ops.txt lists {body['ops_listed']} ops" in res.stdout
    res = runner.invoke(cli, ["export", "--help"])
    assert "ops_bundle" in res.stdout

    # what only the format knows is checked by the format: ops.txt edited, its digest re-pinned
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "ops.txt").write_text("Relu")
    from cann_export.fs import digests

    manifest["files"]["ops.txt"] = {"sha256": digests.sha256_file(out / "ops.txt"), "size": 4}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(errors.ValidateError, match="ops.txt: lists"):
        cann_export.validate(out)
    res = runner.invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 2 and "ops.txt: lists" in res.stderr


def test_the_cli_prints_what_the_format_says(thirdparty, tmp_path):
    from cann_export.cli.main import cli

    out = tmp_path / "ops"
    (tmp_path / "m.mlp").write_text("16")
    res = CliRunner().invoke(cli, [str(tmp_path / "m.mlp"), "--format", "ops_bundle", "--input-shape", "x:2,12",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote ops bundle: {out}" in res.stdout and f"{out}/ops.txt lists" in res.stdout


def test_a_manifest_naming_an_unknown_format_is_refused(thirdparty, tmp_path):
    from cann_export.cli.main import cli

    out = tmp_path / "ops"
    cann_export.export(make_mlp(), out, "ops_bundle", example_inputs=torch.randn(2, 12))
    get_plugin_manager().unregister(thirdparty)  # the plugin that wrote it is not installed here
    try:
        for command in (["validate", str(out)], ["inspect", str(out)]):
            res = CliRunner().invoke(cli, command)
            assert res.exit_code == 2, res.output
            assert "names format 'ops_bundle', which no loaded plugin registers" in res.stderr
            assert "install the plugin that provides 'ops_bundle'" in res.stderr
    finally:
        get_plugin_manager().register(thirdparty, name="thirdparty")
