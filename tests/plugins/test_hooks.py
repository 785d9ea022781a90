"""Each hook, exercised by a test plugin registered and unregistered around the test."""
import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

import cann_export
from cann_export import errors, hookimpl
from cann_export.hooks.manager import get_plugin_manager, registry


class TextFormat:
    """A third-party format: the graph's op list as text, written beside the ONNX file."""

    name = "optext"
    description = "ops as text"
    is_directory = True
    atc_opsets = None
    device_parity = False
    lint = False

    def write(self, ctx, staging: Path):
        from cann_export.graph.onnx_helpers import save_model

        files = save_model(ctx.onnx_model, staging / "model.onnx", external=False)
        ctx.onnx_path = files[0]
        (staging / "ops.txt").write_text("\n".join(n.op_type for n in ctx.onnx_model.graph.node))
        return files + [staging / "ops.txt"]

    def finalize(self, ctx, staging):
        ctx.manifest = {}

    def commit(self, ctx, staging):
        from cann_export.fs import atomic

        atomic.commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(ctx.output_path.iterdir())


def test_third_party_format(plugin, tmp_path):
    @hookimpl
    def register_formats(register):
        register(TextFormat())

    plugin({"register_formats": register_formats}, "optext-plugin")
    result = cann_export.export(make_mlp(), tmp_path / "t", "optext", example_inputs=torch.randn(1, 12))
    assert result.ok and "Gemm" in (tmp_path / "t" / "ops.txt").read_text()
    from cann_export.cli.main import cli

    rows = json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).stdout)
    assert {"name": "optext-plugin", "hooks": ["register_formats"]}.items() <= \
        next(r for r in rows if r["name"] == "optext-plugin").items()


def test_duplicate_names_are_an_error(plugin):
    @hookimpl
    def register_formats(register):
        from cann_export.bundle.format_writers import OnnxFormat

        register(OnnxFormat())

    plugin({"register_formats": register_formats}, "dup")
    with pytest.raises(errors.PluginError, match="two plugins register 'onnx'"):
        registry().formats()


def test_validator_pass_and_provenance_hooks(plugin, tmp_path):
    seen = {}

    class NoGemm:
        name = "no-gemm"
        stage = "lint"
        formats = ("atc_ready",)

        def check(self, ctx):
            time.sleep(0.05)  # the lint stage's timer must include a plugin validator's time
            count = sum(n.op_type == "Gemm" for n in ctx.onnx_model.graph.node)
            return {"passed": count == 0, "gemm_nodes": count}

    class Record:
        name = "record-pass"
        order = 99

        def apply_module(self, model, ctx):
            seen["pass"] = type(model).__name__
            return model

    @hookimpl
    def register_validators(register):
        register(NoGemm())

    @hookimpl
    def register_passes(register):
        register(Record())

    @hookimpl
    def provenance(ctx):
        return {"ci_job": "1234"}

    plugin({"register_validators": register_validators, "register_passes": register_passes,
            "provenance": provenance}, "extras")
    with pytest.raises(errors.LintError, match="lint"):  # a failing lint-stage validator stops the export
        cann_export.export(make_mlp(), tmp_path / "a", example_inputs=torch.randn(1, 12))
    assert not (tmp_path / "a").exists()
    result = cann_export.export(make_mlp(), tmp_path / "b", example_inputs=torch.randn(1, 12), lint="warn")
    assert result.manifest["lint"]["no-gemm"]["gemm_nodes"] == 2
    assert seen["pass"] == "MLP"
    assert result.manifest["provenance"]["ci_job"] == "1234"
    assert result.manifest["stage_seconds"]["lint"] >= 0.05


def test_custom_loader_and_exporter(plugin, tmp_path):
    class NpzLoader:
        name = "mlp-npz"
        priority = 200

        def matches(self, path):
            return path.suffix == ".mlp"

        def load(self, path, options):
            from cann_export import LoadedModel

            return LoadedModel(make_mlp(hidden=int(path.read_text())), "module")

    class TorchScriptOnly:
        name = "ts-only"
        priority = 1000

        def supports(self, model):
            return True

        def export(self, model, ctx):
            from cann_export.capture.exporters import TorchScriptExporter

            return TorchScriptExporter().export(model, ctx)

    @hookimpl
    def register_loaders(register):
        register(NpzLoader())

    @hookimpl
    def register_exporters(register):
        register(TorchScriptOnly())

    plugin({"register_loaders": register_loaders, "register_exporters": register_exporters}, "custom-io")
    (tmp_path / "m.mlp").write_text("16")
    result = cann_export.export(str(tmp_path / "m.mlp"), tmp_path / "b", input_shapes=["x:1,12"])
    assert result.onnx["exporter"] == "ts-only" and result.ok


def test_register_commands(plugin):
    import click

    from cann_export.cli.main import cli

    @click.command("hello")
    def hello():
        click.echo("hi from a plugin")

    @hookimpl
    def register_commands(cli):
        cli.add_command(hello)

    plugin({"register_commands": register_commands}, "cmds")
    registry().add_commands(cli)
    try:
        assert CliRunner().invoke(cli, ["hello"]).stdout == "hi from a plugin\n"
    finally:
        cli.commands.pop("hello")


def test_entry_point_allow_list(monkeypatch):
    from cann_export.hooks import manager as plugin_manager

    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "a, b")
    assert plugin_manager._allowed_entry_points() == {"a", "b"}
    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "")
    assert plugin_manager._allowed_entry_points() == set()
    monkeypatch.delenv("CANN_EXPORT_LOAD_PLUGINS")
    assert plugin_manager._allowed_entry_points() is None


@pytest.fixture
def thirdparty(plugin):
    from helpers import thirdparty_plugin

    thirdparty_plugin.EVENTS.clear()
    get_plugin_manager().register(thirdparty_plugin, name="thirdparty")
    yield thirdparty_plugin
    get_plugin_manager().unregister(thirdparty_plugin)


def test_third_party_pieces_are_used_like_builtins(thirdparty, tmp_path):
    """Loader, exporter (picked by name on the CLI), backend (picked by auto's priority), validator, a format
    that declares it goes to ATC (so opset range, lint and device parity apply) and an ATC hint."""
    from cann_export.cli.main import cli

    (tmp_path / "m.mlp").write_text("16")
    out = tmp_path / "edge"
    res = CliRunner().invoke(cli, [str(tmp_path / "m.mlp"), "--format", "edge_bundle", "--exporter", "plain-ts",
                                   "--input-shape", "x:2,12", "--opset", "17", "-o", str(out), "--json",
                                   "--no-sandbox"])  # the plugin's event log lives in this process
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["onnx"]["exporter"] == "plain-ts" and body["ok"]
    assert thirdparty.EVENTS[:2] == ["loader.load", "backend.activate"]
    assert {"exporter.export", "validator.check", "format.write"} <= set(thirdparty.EVENTS)
    edge = json.loads((out / "edge.json").read_text())
    assert edge["device_precision"] == "force_fp16"  # device parity ran because the format declared it

    # the format's own opset range is enforced before any work, naming the range it declared
    res = CliRunner().invoke(cli, [str(tmp_path / "m.mlp"), "--format", "edge_bundle", "--opset", "18",
                                   "--input-shape", "x:2,12", "-o", str(tmp_path / "e2")])
    assert res.exit_code == 2 and "outside 13..17" in res.output and not (tmp_path / "e2").exists()

    # a plugin hint reaches convert.sh through the same path as the built-in hints
    result = cann_export.export(str(tmp_path / "m.mlp"), tmp_path / "b", input_shapes=["x:2,12"],
                                atc_hints={"buffer_optimize": "l2_optimize", "log": "error"})
    script = (tmp_path / "b" / "atc" / "convert.sh").read_text()
    assert "--buffer_optimize=l2_optimize" in script and "--log=error" in script
    with pytest.raises(errors.OptionsError, match="accepted values: l2_optimize, off_optimize"):
        cann_export.export(str(tmp_path / "m.mlp"), tmp_path / "c", input_shapes=["x:2,12"],
                           atc_hints={"buffer_optimize": "fast"})
    assert result.manifest["lint"]["max-nodes"]["passed"]


def test_choices_come_from_the_registries(thirdparty):
    from cann_export.cli.main import cli

    text = CliRunner().invoke(cli, ["export", "--help"]).stdout
    assert "edge_bundle" in text and "plain-ts" in text and "cpu-twin" in text


def test_an_object_missing_part_of_its_contract_is_refused(plugin):
    class Half:
        name, description, is_directory = "half", "no commit", True

        def write(self, ctx, staging):
            return []

    @hookimpl
    def register_formats(register):
        register(Half())

    plugin({"register_formats": register_formats}, "half")
    with pytest.raises(errors.PluginError, match="'half' lacks .*atc_opsets.*commit"):
        registry().formats()


def test_plugins_show_their_own_distribution(tmp_path, monkeypatch):
    """An entry-point plugin from an installed distribution is listed with that distribution's version."""
    from cann_export.cli.main import cli
    from cann_export.hooks import manager as plugin_manager

    pkg = tmp_path / "cannplug_demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from cann_export import hookimpl\n\n@hookimpl\ndef provenance(ctx):\n"
                                     "    return {'demo': '1'}\n")
    dist = tmp_path / "cannplug_demo-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cannplug-demo\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[cann_export]\ndemo = cannplug_demo\n")
    (dist / "top_level.txt").write_text("cannplug_demo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "demo")
    monkeypatch.setattr(plugin_manager._loaded, "pm", None)
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).stdout)}
    assert rows["demo"]["distribution"] == "cannplug-demo" and rows["demo"]["version"] == "1.2.3"
    assert rows["demo"]["hooks"] == ["provenance"] and not rows["demo"]["builtin"]
    assert rows["cann_export.plugins.formats"]["distribution"] == "cann-export"
    assert rows["cann_export.plugins.formats"]["version"] == cann_export.__version__


def test_plugins_scan_installed_distributions_at_most_once(plugin, monkeypatch):
    """``packages_distributions()`` reads every installed distribution's file list: never for our own or
    entry-point plugins, once for all the others together (it ran once per plugin and made
    ``cann-export plugins`` take seconds)."""
    from importlib import metadata

    from cann_export.hooks.manager import describe_plugins

    calls = []
    real = metadata.packages_distributions
    monkeypatch.setattr(metadata, "packages_distributions", lambda: calls.append(1) or real())
    assert all(r["distribution"] == "cann-export" for r in describe_plugins() if r["builtin"])
    assert calls == []
    for i in range(3):
        plugin({"provenance": hookimpl(lambda ctx: {})}, f"foreign-{i}")
    rows = {r["name"]: r for r in describe_plugins()}
    assert rows["foreign-0"]["distribution"] is None and calls == [1]
