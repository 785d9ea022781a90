"""The stage table and its hooks: a plugin wraps or replaces a stage, a third-party format's failure is a
[write] error, example inputs come from registered providers, and dtypes from the model, not from names."""
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

import cann_export
from cann_export import errors, hookimpl
from cann_export.hooks.manager import registry
from cann_export.options import ExportOptions
from cann_export.pipeline.table import STAGE_NAMES, STAGES

# an int32 tensor default in a forward signature: its dtype is what signature_dtype reads
_INT32_DEFAULT = torch.zeros(2, dtype=torch.int32)


def test_the_table_numbers_twelve_stages_and_commit_comes_after_validate():
    assert STAGE_NAMES == ("load", "prepare", "train", "strip", "capture", "optimize", "annotate", "lint",
                           "write", "validate", "commit", "publish")
    keys = [s.name for s in STAGES]
    assert keys.index("validate") < keys.index("commit") < keys.index("publish")


class RaisingFormat:
    """A third-party format that fails in one of write / finalize / commit with a plain exception."""

    description = "fails on purpose"
    is_directory = True
    atc_opsets = None
    device_parity = False
    lint = False

    def __init__(self, where: str):
        self.name = f"fails-in-{where}"
        self.where = where

    def _maybe_fail(self, where: str) -> None:
        if where == self.where:
            raise RuntimeError(f"disk quota in {where}")

    def write(self, ctx, staging: Path):
        from cann_export.graph.onnx_helpers import save_model

        self._maybe_fail("write")
        files = save_model(ctx.onnx_model, staging / "model.onnx", external=False)
        ctx.onnx_path = files[0]
        return files

    def finalize(self, ctx, staging):
        self._maybe_fail("finalize")

    def commit(self, ctx, staging):
        self._maybe_fail("commit")
        raise AssertionError("unreachable in this test")


@pytest.mark.parametrize("where", ["write", "finalize", "commit"])
def test_a_third_party_formats_exception_is_a_write_error(plugin, tmp_path, where):
    from cann_export.cli.main import cli

    @hookimpl
    def register_formats(register):
        register(RaisingFormat(where))

    plugin({"register_formats": register_formats}, "raising-format")
    model = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(make_mlp().eval(), (torch.randn(2, 12),)), str(model))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [str(model), "-f", f"fails-in-{where}", "-o", str(out)])
    assert result.exit_code == errors.WriteError.exit_code, result.output
    stage = "write" if where == "write" else "commit"  # finalize and commit run in the commit stage
    assert f"[{stage}] ({model}) RuntimeError: disk quota in {where}" in result.stderr
    assert "internal" not in result.stderr and "bug" not in result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]
    if where != "write":  # validate ran on the staged artifact before the failure
        assert "[9/12] write ... 1 files staged" in result.stderr


def test_a_plugin_wraps_every_stage_and_sees_its_result(plugin, tmp_path):
    seen = []

    @hookimpl(wrapper=True)
    def run_stage(stage, ctx):
        assert ctx.stage_seconds.get(stage.name) is None  # the timer is outside this wrapper
        result = yield
        seen.append((stage.name, result))
        return result

    plugin({"run_stage": run_stage}, "stage-recorder")
    lines = []
    result = cann_export.export(make_mlp(), tmp_path / "m.onnx", "onnx", example_inputs=torch.randn(2, 12),
                                progress=lambda i, s, status, sec: lines.append((i, s, status)))
    assert result.ok
    ran = [s.name for s in STAGES if s.enabled(ExportOptions(export_format="onnx"))]
    assert [k for k, _ in seen] == ran
    statuses = dict(seen)
    assert statuses["capture"].startswith(result.onnx["exporter"]) and statuses["validate"] == "passed"
    assert statuses["commit"] == "1 files committed"
    assert [(i, s) for i, s, _ in lines] == [(STAGE_NAMES.index(s.name) + 1, s.name) for s in STAGES]
    assert ("train", "skipped") in [(s, st) for _, s, st in lines]


def test_a_plugin_replaces_a_stages_result(plugin, tmp_path):
    @hookimpl
    def run_stage(stage, ctx):
        if stage.name == "lint":
            ctx.reports.lint["house-lint"] = {"passed": True}
            return "house lint: clean"
        return None  # every other stage: the default body

    plugin({"run_stage": run_stage}, "house-lint")
    lines = []
    result = cann_export.export(make_mlp(), tmp_path / "b", "atc_ready", example_inputs=torch.randn(2, 12),
                                progress=lambda i, s, status, sec: lines.append((s, status)))
    assert result.ok and ("lint", "house lint: clean") in lines
    assert "atc_lint" not in result.manifest.get("reports", {}) and result.manifest["stage_seconds"]["lint"] >= 0


def test_a_registered_input_provider_is_asked_in_priority_order(plugin, tmp_path):
    class Fixed:
        name = "fixed"
        priority = 95  # between example_inputs= (100) and --example-inputs (90)

        def provide(self, ctx):
            return {"x": torch.ones(3, 12)}, "the house dataset"

    @hookimpl
    def register_input_providers(register):
        register(Fixed())

    plugin({"register_input_providers": register_input_providers}, "house-inputs")
    assert [p.name for p in registry().input_providers()][:3] == ["example_inputs", "fixed", "example_inputs_file"]
    lines = []
    model = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(make_mlp().eval(), (torch.randn(3, 12),)), str(model))
    result = cann_export.export(str(model), tmp_path / "m.onnx", "onnx",
                                progress=lambda i, s, status, sec: lines.append((s, status)))
    assert result.ok and ("prepare", "5 input sets from the house dataset") in lines
    lines.clear()
    cann_export.export(str(model), tmp_path / "n.onnx", "onnx", example_inputs=torch.zeros(3, 12),
                       progress=lambda i, s, status, sec: lines.append((s, status)))
    assert ("prepare", "5 input sets from example_inputs") in lines  # the explicit argument comes first


class Tokens(torch.nn.Module):
    """A token model whose input is not named like ``*_ids``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(37, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(dim=1))


def test_an_input_shape_without_dtype_takes_the_models(tmp_path):
    from cann_export.inputs.tensors import tensors_from_specs
    from cann_export.options import parse_input_shape

    feed = tensors_from_specs([parse_input_shape("tokens:1,16")], Tokens(), seed=0)
    assert feed["tokens"].dtype == torch.int64 and int(feed["tokens"].max()) < 37
    result = cann_export.export(Tokens().eval(), tmp_path / "b", input_shapes=["tokens:1,16"])
    assert result.ok, result.parity
    assert {i["name"]: i["dtype"] for i in result.manifest["model"]["inputs"]} == {"tokens": "int64"}


def test_a_torchscript_token_model_on_the_command_line(tmp_path):
    from cann_export.cli.main import cli

    path = tmp_path / "tokens.pt"
    torch.jit.script(Tokens().eval()).save(str(path))
    out = tmp_path / "t.onnx"
    result = CliRunner().invoke(cli, [str(path), "-f", "onnx", "--input-shape", "tokens:1,16", "-o", str(out)])
    assert result.exit_code == 0, result.output
    import onnx

    graph = onnx.load(str(out)).graph
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_an_annotated_or_defaulted_parameter_gives_its_dtype():
    from cann_export.inputs.signature import signature_dtype

    class Annotated(torch.nn.Module):
        def forward(self, a: torch.LongTensor, b: "torch.BoolTensor | None" = None, c=_INT32_DEFAULT,
                    d: torch.Tensor = None):
            return a

    model = Annotated()
    assert [signature_dtype(model, n) for n in "abcd"] == ["int64", "bool", "int32", None]


class Derived(torch.nn.Module):
    """Token inputs reach their embeddings through a slice and a cast; position ids computed from them
    index another table (they must not be taken for the input's own); a BatchNorm runs in train mode."""

    def __init__(self):
        super().__init__()
        self.words = torch.nn.Embedding(40, 8)
        self.positions = torch.nn.Embedding(99, 8)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, ids, tokens, x):
        positions = ids.ne(0).int().cumsum(1)
        return (self.positions(positions).sum() + self.words(ids[:, 1:]).sum() + self.words(tokens.long()).sum()
                + self.bn(x).sum())


def test_an_input_reaching_its_embedding_through_a_slice_or_a_cast_is_found_without_side_effects():
    from cann_export.inputs.signature import spec_dtypes
    from cann_export.options import InputSpec

    model = Derived().train()
    running, rng = model.bn.running_mean.clone(), torch.random.get_rng_state()
    dtypes, rows = spec_dtypes(model, [InputSpec("ids", (2, 6)), InputSpec("tokens", (2, 6)), InputSpec("x", (4, 3))])
    assert dtypes == {"ids": "int64", "tokens": "int64", "x": "float32"} and rows == {"ids": 40, "tokens": 40}
    assert torch.equal(model.bn.running_mean, running) and torch.equal(torch.random.get_rng_state(), rng)
    assert model.training and model.bn.training
