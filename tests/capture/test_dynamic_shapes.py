"""Issue 19 item 3: keyword inputs of .pt2 archives and dynamic shapes end to end: a .pt2's Dims, --dynamic and
-1 in --input-shape become symbolic ONNX dims; the ATC command takes the form the CANN release accepts; the
lint names ATC's error codes; parity runs at every gear / range point; bad --dynamic is refused."""
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from helpers import origin_models as om

import cann_export
from cann_export.atc.dynamic_form import atc_form
from cann_export.atc.lint import lint_model
from cann_export.cli.main import cli
from cann_export.dynamic import DynamicAxis, from_records, parse_dynamic
from cann_export.errors import OptionsError


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, input_ids, attention_mask):
        return self.out(self.emb(input_ids) * attention_mask.unsqueeze(-1).float())


class Specialises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).reshape(2, -1)  # the batch of 2 is baked in


class FixedSeq(torch.nn.Module):
    """Runs at any size, but branches on the sequence length: torch.export specialises it, not the batch."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)

    def forward(self, input_ids):
        out = self.emb(input_ids)
        return out * 2 if input_ids.shape[1] == 8 else out


def dims(path: Path) -> dict[str, list]:
    model = onnx.load(str(path))
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def convert_line(bundle: Path) -> str:
    return (bundle / "atc" / "convert.sh").read_text().strip().splitlines()[-1]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("dynamic")


@pytest.fixture(scope="module")
def batch_bundle(work):
    """A .pt2 captured with Dim("batch", min=1, max=16), exported to an atc_ready bundle for CANN 8.0."""
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(Conv().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(work / "conv.pt2"))
    result = cann_export.export(str(work / "conv.pt2"), work / "conv", sandbox="off")
    return work / "conv", result


def test_pt2_dim_becomes_a_symbolic_onnx_dim_that_onnxruntime_runs(batch_bundle):
    bundle, result = batch_bundle
    assert result.ok
    assert dims(bundle / "model.onnx") == {"x": ["batch", 3, 8, 8]}
    sess = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 7):
        (out,) = sess.run(None, {"x": np.random.randn(n, 3, 8, 8).astype(np.float32)})
        assert out.shape == (n, 4)
    program = torch.export.load(str(bundle / "torch" / "program.pt2"))  # the bundle's program keeps the Dim
    assert [(int(r.lower), int(r.upper)) for r in program.range_constraints.values()] == [(1, 16)]


def test_pt2_dim_renders_a_range_on_cann8_and_gears_on_cann7(batch_bundle):
    bundle, _ = batch_bundle
    assert "--input_shape=x:1~16,3,8,8" in convert_line(bundle)
    assert "dynamic_batch_size" not in convert_line(bundle) and "input_shape_range" not in convert_line(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    axes = from_records(manifest["atc"]["dynamic"]["axes"])
    form = atc_form(onnx.load(str(bundle / "model.onnx")), axes, "7.0", {})
    assert form["input_shape"] == "x:-1,3,8,8"
    assert form["options"] == {"dynamic_batch_size": "1,2,4,8,16"}
    assert lint_model(onnx.load(str(bundle / "model.onnx")), "7.0", {}, dynamic=axes)["passed"]


def test_lint_of_the_bundle_rederives_its_dynamic_form(batch_bundle):
    from cann_export.cli.main import _register_plugin_commands

    _register_plugin_commands()
    bundle, _ = batch_bundle
    assert CliRunner().invoke(cli, ["lint", str(bundle), "--cann-version", "8.0"]).exit_code == 0
    older = CliRunner().invoke(cli, ["lint", str(bundle), "--cann-version", "7.0", "--json"])
    assert older.exit_code == 1  # convert.sh holds 1~16, which ATC takes from CANN 8.0 on
    assert [f["rule"] for f in json.loads(older.stdout)["findings"]] == ["dynamic-range-version"]


def test_parity_runs_at_the_range_ends_and_middle(batch_bundle):
    bundle, _ = batch_bundle
    shapes = json.loads((bundle / "manifest.json").read_text())["parity"]["shapes"]
    assert [s["shape"] for s in shapes] == [{"batch": 2}, {"batch": 1}, {"batch": 8}, {"batch": 16}]
    assert all(s["fp32"] and s["device"] and s["passed"] for s in shapes)
    parity = json.loads((bundle / "parity.json").read_text())
    assert parity["passed"] and len(parity["shapes"]) == 4


def test_each_extra_shape_is_judged_on_one_input_set(batch_bundle):
    """The example's shape keeps its several sets (example + random variants); each other size one set, drawn
    like the example (a second draw doubled the largest forwards, batch 16, for no other check)."""
    bundle, result = batch_bundle
    rows = json.loads((bundle / "manifest.json").read_text())["parity"]["shapes"]
    assert [len(r["input_sets"]) for r in rows[1:]] == [1, 1, 1], rows
    assert len(rows[0]["input_sets"]) >= 3  # the example and its realistic random variants decide there
    assert result.parity["input_sets_from"]["shapes"] == 3
    assert result.parity["input_sets"] == 5 + 3


def test_validate_rederives_the_dynamic_command_and_shapes(batch_bundle):
    bundle, _ = batch_bundle
    report = cann_export.validate(bundle)
    assert report["passed"], report
    assert [s["passed"] for s in report["shapes"]] == [True] * 4


def test_validate_refuses_a_manifest_whose_shape_verdicts_were_edited(batch_bundle, tmp_path):
    import shutil

    from cann_export.errors import ValidateError

    copy = tmp_path / "edited"
    shutil.copytree(batch_bundle[0], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parity"]["shapes"][1]["shape"] = {"batch": 3}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValidateError, match="parity.shapes"):
        cann_export.validate(copy)


def _tampered(bundle: Path, copy: Path, edit) -> Path:
    """A copy of ``bundle`` whose manifest text (and convert.sh) went through ``edit``, convert.sh's digest kept
    consistent: what a reviewer who widens a range by hand writes."""
    import hashlib
    import shutil

    shutil.copytree(bundle, copy)
    script = copy / "atc" / "convert.sh"
    script.write_text(edit(script.read_text()))
    manifest = json.loads(edit((copy / "manifest.json").read_text()))
    manifest["files"]["atc/convert.sh"] = {"sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
                                           "size": script.stat().st_size}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_validate_refuses_a_dynamic_range_widened_after_parity(batch_bundle, tmp_path):
    from cann_export.errors import ValidateError

    copy = _tampered(batch_bundle[0], tmp_path / "wide", lambda text: text.replace("1~16", "1~2048").replace(
        '"max": 16', '"max": 2048'))
    assert "1~2048" in convert_line(copy)
    with pytest.raises(ValidateError, match=r"manifest.json parity.shapes: parity ran at .*batch 1..2048") as e:
        cann_export.validate(copy)
    assert e.value.exit_code == 2
    run = CliRunner().invoke(cli, ["validate", str(copy)])
    assert run.exit_code == 2 and "manifest.json" in run.output


def test_validate_refuses_a_dynamic_axis_the_graph_does_not_have(batch_bundle, tmp_path):
    from cann_export.errors import ValidateError

    copy = _tampered(batch_bundle[0], tmp_path / "renamed", lambda text: text.replace('"name": "batch"',
                                                                                      '"name": "images"'))
    with pytest.raises(ValidateError, match=r"atc.dynamic.axes: x:0=images is not a symbolic dimension"):
        cann_export.validate(copy)


def test_fix_precision_judges_every_shape_with_the_fixed_keep_set(work):
    """--fix-precision on a dynamic graph: the other shapes' device verdicts use the keep set the fix found (as
    validate does), not the one from before the fix (with which fp16 overflows at every shape). One block: its
    three norms overflow as every block's does (the fix keeps each); the sandboxed load of a .pt2 through the CLI
    is test_bert_pt2_with_keyword_inputs_through_the_cli's."""
    _, inputs, _ = om.rms_decoder()
    model = om.RmsDecoder(layers=1).eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(model, (inputs["input_ids"],), dynamic_shapes={"input_ids": {0: batch}})
    torch.export.save(program, str(work / "rms.pt2"))
    run = CliRunner().invoke(cli, [str(work / "rms.pt2"), "-o", str(work / "rms"), "--fix-precision", "--soc-version",
                                   "Ascend910B1", "--json", "--no-sandbox"])
    assert run.exit_code == 0, run.output
    manifest = json.loads((work / "rms" / "manifest.json").read_text())
    assert manifest["parity"]["fixed_by_keep_dtype"]
    assert [(s["shape"], s["device"]) for s in manifest["parity"]["shapes"]] == [
        ({"batch": 2}, True), ({"batch": 1}, True), ({"batch": 4}, True)]
    assert cann_export.validate(work / "rms")["passed"]


@pytest.fixture(scope="module")
def kwargs_programs(work):
    torch.manual_seed(0)
    model = Tokens().eval()
    ids, mask = torch.randint(0, 50, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    torch.export.save(torch.export.export(model, (ids,), {"attention_mask": mask}), str(work / "mixed.pt2"))
    return work


# an all-keyword .pt2 through dynamo (was ("kw", "dynamo") here): test_bert_pt2_with_keyword_inputs_through_the_cli,
# the same capture path (no positional input), asserts the export and the names too
@pytest.mark.parametrize("name,exporter", [("mixed", "dynamo"), ("mixed", "torchscript")])
def test_pt2_with_keyword_inputs_exports_with_their_names(kwargs_programs, name, exporter):
    out = kwargs_programs / f"{name}_{exporter}.onnx"
    result = cann_export.export(str(kwargs_programs / f"{name}.pt2"), out, "onnx", exporter=exporter, sandbox="off")
    assert result.ok, result.parity
    assert list(dims(out)) == ["input_ids", "attention_mask"]


def test_bert_pt2_with_keyword_inputs_through_the_cli(work):
    """An all-keyword .pt2 of a real BERT (one layer: the keyword inputs are the point) through the CLI's default
    sandboxed load; the CLI as a separate process is tests/cli/test_cli.py's."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    model = BertModel(config).eval()
    ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    torch.export.save(torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask}),
                      str(work / "bert.pt2"))
    run = CliRunner().invoke(cli, [str(work / "bert.pt2"), "-o", str(work / "bert"), "--json"])
    assert run.exit_code == 0, run.output[-2000:]
    assert list(dims(work / "bert" / "model.onnx")) == ["input_ids", "attention_mask"]
    assert (work / "bert" / "torch" / "program.pt2").is_file()


@pytest.fixture(scope="module")
def seq_bundle(work):
    """A BERT-like model (token ids + mask) with --dynamic input_ids:1=seq:8..64 for CANN 7.0."""
    torch.manual_seed(0)
    result = cann_export.export(Tokens(), work / "seq", input_shapes=["input_ids:2,16", "attention_mask:2,16"],
                                dynamic=["input_ids:1=seq:8..64"], cann_version="7.0")
    return work / "seq", result


def test_dynamic_seq_gets_dynamic_dims_in_nd_for_older_cann(seq_bundle):
    bundle, result = seq_bundle
    assert result.ok
    assert dims(bundle / "model.onnx") == {"input_ids": [2, "seq"], "attention_mask": [2, "seq"]}
    line = convert_line(bundle)
    assert "'--input_shape=input_ids:2,-1;attention_mask:2,-1'" in line
    assert "'--dynamic_dims=8,8;16,16;32,32;64,64'" in line and "--input_format=ND" in line
    shapes = json.loads((bundle / "manifest.json").read_text())["parity"]["shapes"]
    # parity runs at the gears ATC builds (8, 16, 32, 64), not at the range's middle (36)
    assert [s["shape"] for s in shapes] == [{"seq": 16}, {"seq": 8}, {"seq": 32}, {"seq": 64}]
    assert all(s["passed"] for s in shapes)


def test_more_than_100_dynamic_dims_profiles_are_refused_not_cut(tmp_path):
    """batch 1..2048 x seq 1..4096 on CANN 7 is 12 x 13 = 156 profiles: refused (exit 2, nothing written), not
    silently cut to the first 100 (whose largest batch was 128); CANN 8 takes the ranges."""
    graph = static_graph((2, 16))
    for d, name in zip(graph.graph.input[0].type.tensor_type.shape.dim, ("batch", "seq"), strict=True):
        d.dim_param = name
    axes = parse_dynamic("x:0=batch:1..2048,1=seq:1..4096")
    with pytest.raises(OptionsError, match=r"156 profiles, past ATC's 100.*--cann-version"):
        atc_form(graph, axes, "7.0", {})
    assert atc_form(graph, axes, "8.0", {})["input_shape"] == "x:1~2048,1~4096"
    geared = parse_dynamic("x:0=batch:1,2,4,8,16,32,64,128,256,512,1024,2048,1=seq:1..4096")  # CANN 8: no hint of it
    with pytest.raises(OptionsError, match=r"gears were asked on one axis.*give every axis a range") as e:
        atc_form(graph, geared, "8.0", {})
    assert "--cann-version" not in str(e.value)
    out = tmp_path / "out"
    torch.save(Tokens().state_dict(), str(tmp_path / "tok.pt"))
    run = CliRunner().invoke(cli, [str(tmp_path / "tok.pt"), "--model-class", f"{__name__}:Tokens", "--input-shape",
                                   "input_ids:2,16", "--input-shape", "attention_mask:2,16", "--dynamic",
                                   "input_ids:0=batch:1..2048,1=seq:1..4096", "--cann-version", "7.0", "-o",
                                   str(out), "--no-sandbox"])
    assert run.exit_code == 2, run.output
    assert "--dynamic" in run.output and "profiles" in run.output
    assert not out.exists()


def test_gears_are_the_parity_points(work):
    result = cann_export.export(Conv(), work / "gears", input_shapes=["x:2,3,8,8"], dynamic="x:0=batch:1,2,4,8",
                                validate=True)
    manifest = json.loads((work / "gears" / "manifest.json").read_text())
    assert result.ok
    assert [s["shape"]["batch"] for s in manifest["parity"]["shapes"]] == [2, 1, 4, 8]
    assert "--input_shape=x:-1,3,8,8" in convert_line(work / "gears")  # gears asked: the gear form on CANN 8 too
    assert "--dynamic_batch_size=1,2,4,8" in convert_line(work / "gears")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_minus_one_in_input_shape_is_a_dynamic_axis_with_the_default_range(work, exporter):
    result = cann_export.export(Conv(), work / f"minus_{exporter}.onnx", "onnx", input_shapes=["x:-1,3,8,8"],
                                exporter=exporter)
    assert result.ok and result.onnx["exporter"] == exporter
    assert dims(work / f"minus_{exporter}.onnx") == {"x": ["batch", 3, 8, 8]}
    assert [s["shape"]["batch"] for s in result.parity["shapes"]] == [2, 1, 8, 16]


def test_a_static_graph_from_a_dynamic_source_is_a_warning_naming_the_axis(work):
    result = cann_export.export(Specialises(), work / "spec", input_shapes=["x:2,8"], dynamic="x:0=batch:1..16")
    manifest = json.loads((work / "spec" / "manifest.json").read_text())
    assert result.ok
    assert dims(work / "spec" / "model.onnx") == {"x": [2, 8]}
    (warning,) = manifest["warnings"]["dynamic"]
    assert warning.startswith("x:0 (batch, 1..16")
    assert "--input_shape=x:2,8" in convert_line(work / "spec")


@pytest.mark.parametrize("spec,words", [
    ("y:0=batch:1..16", "names input 'y'"),
    ("x:4=b:1..4", "axis 4 does not exist"),
    ("x:0=batch:16..1", "empty or inverted"),
    ("x:0=batch:1", "2..100 gears"),
    ("x:0=batch:1,2,4,4096", "outside 1..2048"),
    ("x:0=batch:4..8", "size 2 is outside 4..8"),
    ("x", "does not parse"),
])
def test_bad_dynamic_is_refused_with_exit_2_and_nothing_written(tmp_path, spec, words):
    out = tmp_path / "out"
    from safetensors.torch import save_file

    save_file(Conv().state_dict(), str(tmp_path / "conv.safetensors"))
    run = CliRunner().invoke(cli, [str(tmp_path / "conv.safetensors"), "--model-class", f"{__name__}:Conv",
                                   "--input-shape", "x:2,3,8,8", "--dynamic", spec, "-o", str(out), "--no-sandbox"])
    assert run.exit_code == 2, run.output
    assert words in run.output and "--dynamic" in run.output
    assert not out.exists()


def test_dynamic_parses_ranges_gears_and_names():
    assert parse_dynamic("input_ids:0=batch:1..16,1=seq:1..512") == [
        DynamicAxis("input_ids", 0, "batch", 1, 16), DynamicAxis("input_ids", 1, "seq", 1, 512)]
    assert parse_dynamic("x:0=batch:1,2,4,8,2=1..4")[0].gears == (1, 2, 4, 8)
    assert parse_dynamic("x:0=1..4")[0] == DynamicAxis("x", 0, None, 1, 4)
    with pytest.raises(OptionsError, match="axis 0 twice"):
        parse_dynamic("x:0=a:1..2,0=b:1..3")


def static_graph(shape=(2, 3, 8, 8)):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(shape))
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize("hints,cann,rule,code", [
    ({"input_shape": "x:2,3,8,8", "dynamic_batch_size": "1,2,4"}, "8.0", "dynamic-minus-one", "E10031"),
    ({"input_shape": "x:-1,3,8,8"}, "7.0", "dynamic-minus-one", "E10018"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "4"}, "7.0", "dynamic-gear-count", "E10001"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": ",".join(map(str, range(1, 103)))}, "7.0",
     "dynamic-gear-count", "E10001"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1,4096"}, "7.0", "dynamic-gear-value", "E10001"),
    ({"input_shape": "x:2,-1,-1,8", "dynamic_dims": "1,2;3", "input_format": "ND"}, "7.0", "dynamic-dims-count",
     "E10040"),
    ({"input_shape": "x:2,3,-1,8", "dynamic_dims": "4;8"}, "7.0", "dynamic-dims-format", "E10001"),
    ({"input_shape": "x:2,3,-1,8", "dynamic_dims": "4;8", "input_format": "ND", "aipp": [{}]}, "7.0",
     "dynamic-aipp", "E10001"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1,2", "input_shape_range": "x:[1~2,3,8,8]"}, "7.0",
     "dynamic-exclusive", "E10001"),
    ({"input_shape": "x:1~4,3,8,8"}, "7.0", "dynamic-range-version", "E10001"),
    ({"input_shape": "x:2,3,8,8", "input_shape_range": "x:[1~2,3,8,8]"}, "8.0", "dynamic-range-deprecated", None),
])
def test_each_atc_dynamic_rule_names_its_code(hints, cann, rule, code):
    report = lint_model(static_graph(), cann, hints)
    found = [f for f in report["findings"] if f["rule"] == rule]
    assert found, report["findings"]
    assert code is None or code in found[0]["message"]


def test_a_batch_gear_hint_renders_minus_one_in_the_batch_position(work):
    result = cann_export.export(Conv(), work / "hint", input_shapes=["x:2,3,8,8"],
                                atc_hints={"dynamic_batch_size": "1,2,4,8"}, lint="warn")
    line = convert_line(work / "hint")
    assert result.ok
    assert "--input_shape=x:-1,3,8,8" in line and "--dynamic_batch_size=1,2,4,8" in line


def test_a_loaders_task_axes_become_symbolic_dims_with_default_ranges(plugin, tmp_path):
    """A loader's Optimum-style axes ({input: {axis: name}}, as the Hugging Face loader gives) with no range:
    batch 1..64 on axis 0, else 1..4x the example's size; the mask follows input_ids."""
    from cann_export import LoadedModel, hookimpl

    class TokensLoader:
        name = "tokens-test"
        priority = 1000

        def matches(self, path):
            return path.suffix == ".tokens"

        def load(self, path, options):
            torch.manual_seed(0)
            feed = {"input_ids": torch.randint(0, 50, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
            return LoadedModel(Tokens().eval(), "module", example_inputs=feed,
                               extras={"dynamic_axes": {"input_ids": {0: "batch_size", 1: "sequence_length"}}})

    @hookimpl
    def register_loaders(register):
        register(TokensLoader())

    plugin({"register_loaders": register_loaders}, "tokens-loader")
    (tmp_path / "m.tokens").write_text("")
    result = cann_export.export(str(tmp_path / "m.tokens"), tmp_path / "b", sandbox="off")
    assert result.ok
    assert dims(tmp_path / "b" / "model.onnx") == {"input_ids": ["batch_size", "sequence_length"],
                                                   "attention_mask": ["batch_size", "sequence_length"]}
    assert ("'--input_shape=input_ids:1~16,1~32;attention_mask:1~16,1~32'" in convert_line(tmp_path / "b"))
    assert len(result.parity["shapes"]) == 7 and all(s["passed"] for s in result.parity["shapes"])


@pytest.mark.parametrize("value,ok", [("x:1~16,3,224,224", True), ("x:-1,3,224,224;y:-1,4", True),
                                      ("x:1~,3", False), ("x:-2,3", False), ("x:1~16~32,3", False)])
def test_the_input_shape_hint_takes_ranges_and_minus_one(value, ok):
    from cann_export.atc import hints
    from cann_export.options import ExportOptions

    opts = ExportOptions(atc_hints={"input_shape": value})
    if ok:
        hints.resolve(opts)
        assert opts.atc_hints["input_shape"] == value
    else:
        with pytest.raises(OptionsError, match="input_shape"):
            hints.resolve(opts)


def test_static_shapes_turns_every_source_off(batch_bundle, work):
    result = cann_export.export(str(work / "conv.pt2"), work / "static.onnx", "onnx", static_shapes=True,
                                sandbox="off")
    assert result.ok and dims(work / "static.onnx") == {"x": [2, 3, 8, 8]} and "shapes" not in result.parity
    with pytest.raises(OptionsError, match="static_shapes=True"):
        cann_export.export(Conv(), work / "x.onnx", "onnx", static_shapes=True, dynamic="x:0=b:1..4")


def test_an_axis_torch_specialises_is_dropped_and_the_others_kept(work):
    result = cann_export.export(FixedSeq(), work / "fixedseq.onnx", "onnx", input_shapes=["input_ids:2,8"],
                                dynamic="input_ids:0=batch:1..16,1=seq:4..16")
    assert result.ok
    assert dims(work / "fixedseq.onnx") == {"input_ids": ["batch", 8]}
    assert [s["shape"] for s in result.parity["shapes"]] == [{"batch": 2}, {"batch": 1}, {"batch": 8}, {"batch": 16}]
    (warning,) = result.manifest["warnings"]["dynamic"]
    assert warning.startswith("input_ids:1 (seq, 4..16, from --dynamic) is static (8)")
