"""Each hook, exercised by a test plugin registered and unregistered around the test."""
import json
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

import cann_export
from cann_export import errors, hookimpl
from cann_export.plugin_manager import collect, get_plugin_manager


@pytest.fixture
def plugin():
    pm = get_plugin_manager()
    registered = []

    def register(namespace: dict, name: str):
        module = types.SimpleNamespace(**namespace)
        pm.register(module, name=name)
        registered.append(module)
        return module

    yield register
    for module in registered:
        pm.unregister(module)


class TextFormat:
    """A third-party format: the graph's op list as text, written beside the ONNX file."""

    name = "optext"
    description = "ops as text"
    is_directory = True

    def write(self, ctx, staging: Path):
        from cann_export.onnx_utils import save_model

        files = save_model(ctx.onnx_model, staging / "model.onnx", external=False)
        ctx.onnx_path = files[0]
        (staging / "ops.txt").write_text("\n".join(n.op_type for n in ctx.onnx_model.graph.node))
        return files + [staging / "ops.txt"]

    def finalize(self, ctx, staging):
        ctx.manifest = {}

    def commit(self, ctx, staging):
        from cann_export import atomic

        atomic.commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(ctx.output_path.iterdir())


def test_third_party_format(plugin, tmp_path):
    @hookimpl
    def register_formats(register):
        register(TextFormat())

    plugin({"register_formats": register_formats}, "optext-plugin")
    result = cann_export.export(make_mlp(), tmp_path / "t", "optext", example_inputs=torch.randn(1, 12))
    assert result.ok and "Gemm" in (tmp_path / "t" / "ops.txt").read_text()
    from cann_export.cli import cli

    rows = json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).stdout)
    assert {"name": "optext-plugin", "hooks": ["register_formats"]}.items() <= \
        next(r for r in rows if r["name"] == "optext-plugin").items()


def test_duplicate_names_are_an_error(plugin):
    @hookimpl
    def register_formats(register):
        register(types.SimpleNamespace(name="onnx"))

    plugin({"register_formats": register_formats}, "dup")
    with pytest.raises(errors.PluginError, match="two plugins register 'onnx'"):
        collect("register_formats")


def test_validator_pass_and_provenance_hooks(plugin, tmp_path):
    seen = {}

    class NoGemm:
        name = "no-gemm"
        stage = "lint"
        formats = ("atc_ready",)

        def check(self, ctx):
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
    assert result.manifest["stage_seconds"]["lint"] >= 0


def test_custom_loader_and_exporter(plugin, tmp_path):
    class NpzLoader:
        name = "mlp-npz"
        priority = 200

        def matches(self, path):
            return path.suffix == ".mlp"

        def load(self, path, options):
            from cann_export.pipeline import LoadedModel

            return LoadedModel(make_mlp(hidden=int(path.read_text())), "module")

    class TorchScriptOnly:
        name = "ts-only"
        priority = 1000

        def supports(self, model):
            return True

        def export(self, model, ctx):
            from cann_export.plugins.capture import TorchScriptExporter

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

    from cann_export.cli import cli

    @click.command("hello")
    def hello():
        click.echo("hi from a plugin")

    @hookimpl
    def register_commands(cli):
        cli.add_command(hello)

    plugin({"register_commands": register_commands}, "cmds")
    get_plugin_manager().hook.register_commands(cli=cli)
    try:
        assert CliRunner().invoke(cli, ["hello"]).stdout == "hi from a plugin\n"
    finally:
        cli.commands.pop("hello")


def test_entry_point_allow_list(monkeypatch):
    from cann_export import plugin_manager

    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "a, b")
    assert plugin_manager._allowed_entry_points() == {"a", "b"}
    monkeypatch.setenv("CANN_EXPORT_LOAD_PLUGINS", "")
    assert plugin_manager._allowed_entry_points() == set()
    monkeypatch.delenv("CANN_EXPORT_LOAD_PLUGINS")
    assert plugin_manager._allowed_entry_points() is None
