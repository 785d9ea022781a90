"""The Python API as a new user meets it (issue 46): it infers an input shape from the first layer as the CLI does,
its errors name its own arguments (``input_shapes=``, ``example_inputs=``) rather than the CLI's flags; and
``--dynamic DIM=...`` by dimension name (the multi-graph form) works for one graph, where gears asked on one
dimension leave the dimensions nobody asked about static (with a warning) instead of silently turning them into
gears too. Real exports: a small CNN, and a Hugging Face BERT directory (tiny config, random weights)."""
import json

import pytest
import torch
from click.testing import CliRunner
from helpers import hf_dirs

import cann_export
from cann_export.cli.main import cli
from cann_export.errors import OptionsError


class TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return a * b + 1


def test_the_api_infers_an_input_shape_from_the_first_layer_as_the_cli_does(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    result = cann_export.export(model, tmp_path / "b", validate=False)
    assert result.ok
    note = result.manifest["warnings"]["inputs"]
    assert "inferred from the first Conv2d" in note and "input_shapes=['input:1,3,224,224']" in note


def test_api_errors_name_the_api_arguments_and_the_cli_its_flags(tmp_path):
    with pytest.raises(cann_export.ExportError) as caught:
        cann_export.export(TwoInputs(), tmp_path / "b", validate=False)
    assert "example_inputs=" in caught.value.message and "input_shapes=" in caught.value.message
    assert "--" not in caught.value.message
    with pytest.raises(cann_export.ExportError) as caught:
        cann_export.export(TwoInputs(), tmp_path / "b", input_shapes=["a:x"])
    assert caught.value.message.startswith("input_shapes=['a:x']") and "--input-shape" not in caught.value.message
    with pytest.raises(cann_export.ExportError) as caught:
        cann_export.export(TwoInputs(), tmp_path / "b", soc_version="Ascend310P")
    assert "allow_unknown_soc=True" in caught.value.message and "--" not in caught.value.message
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "m.pt2"), "--input-shape", "a:x"])
    assert result.exit_code == 2 and "--input-shape 'a:x'" in result.output


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return hf_dirs.save("bert", tmp_path_factory.mktemp("hf") / "tiny-bert")


def _atc(out):
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, (out / "atc" / "convert.sh").read_text()


@pytest.mark.parametrize("asked", [["batch_size=1,2,4"], ["input_ids:0=batch_size:1,2,4"]], ids=["by-name", "by-input"])
def test_batch_gears_leave_the_sequence_static_and_say_so(tmp_path, bert_dir, asked):
    out = tmp_path / "b"
    result = cann_export.export(bert_dir, out, dynamic=asked)
    assert result.ok
    manifest, script = _atc(out)
    dynamic = manifest["atc"]["dynamic"]
    assert dynamic["form"] == "dynamic_batch_size"
    assert {(a["input"], a["axis"]) for a in dynamic["axes"]} == {
        ("input_ids", 0), ("attention_mask", 0), ("token_type_ids", 0)}
    assert all(a["gears"] == [1, 2, 4] for a in dynamic["axes"])
    assert "dynamic_batch_size=1,2,4" in script and "dynamic_dims" not in script
    (note,) = [w for w in manifest["warnings"]["dynamic"] if w.startswith("sequence_length")]
    assert "exported static" in note and "--dynamic sequence_length=G1,G2,..." in note


def test_a_dimension_range_by_name_narrows_every_axis_of_that_name(tmp_path, bert_dir):
    out = tmp_path / "b"
    assert cann_export.export(bert_dir, out, dynamic=["batch_size=1..4", "sequence_length=2..32"]).ok
    manifest, script = _atc(out)
    ranges = {(a["input"], a["axis"]): (a["min"], a["max"]) for a in manifest["atc"]["dynamic"]["axes"]}
    assert ranges[("attention_mask", 0)] == (1, 4) and ranges[("token_type_ids", 1)] == (2, 32)
    assert "input_ids:1~4,2~32" in script
    with pytest.raises(OptionsError) as caught:
        cann_export.export(bert_dir, tmp_path / "c", dynamic=["seq_len=1..8"])
    assert "no dynamic dimension of this model is named 'seq_len'" in caught.value.message
    assert "batch_size" in caught.value.message and "sequence_length" in caught.value.message
