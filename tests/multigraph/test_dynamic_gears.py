"""`--dynamic DIM=G1,G2,...` on a multi-graph export: ATC gears per dimension. Each component gets the options a
user's gear hint would give (``input_format=ND`` + ``dynamic_dims``: one profile per combination of its dimensions'
sizes, a ranged dimension as its ends, the powers of two between and the example's size), parity runs at those
sizes, validate re-derives them. Checked independently: onnxruntime runs each graph at every profile ATC would
build, the inputs shaped from convert.sh's own --input_shape with its -1s filled from the profile."""
from __future__ import annotations

import json
import re
import shlex

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import cann_export
from cann_export.cli.main import cli
from helpers.hf_models import tiny_decoder_gpt2

DYNAMIC = ["batch_size=1,2,4", "sequence_length=1..12", "decode:past_sequence_length=4..10"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyngears")
    tiny_decoder_gpt2().save_pretrained(root / "gpt2-dir")  # positions 16
    args = [str(root / "gpt2-dir"), "-o", str(root / "gpt2")]
    for d in DYNAMIC:
        args += ["--dynamic", d]
    run = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert run.exit_code == 0, run.output
    return root / "gpt2"


def _atc_options(bundle, name):
    line = next(x for x in (bundle / "components" / name / "atc" / "convert.sh").read_text().splitlines()
                if x.startswith("atc "))
    return dict(a[2:].split("=", 1) for a in shlex.split(line)[1:] if a.startswith("--") and "=" in a)


def _profiles(options):
    """(input name, shape with -1s) in --input_shape order, and the dynamic_dims profiles."""
    shapes = [(name, [int(v) for v in dims.split(",")])
              for name, dims in (part.rsplit(":", 1) for part in options["input_shape"].split(";"))]
    return shapes, [[int(v) for v in row.split(",")] for row in options["dynamic_dims"].split(";")]


@pytest.mark.parametrize("name, sizes", [
    ("prefill", {"batch_size": [1, 2, 4], "sequence_length": [1, 2, 4, 7, 8, 12]}),
    ("decode", {"batch_size": [1, 2, 4], "past_sequence_length": [4, 7, 8, 10]}),
])
def test_each_component_gets_dims_gears_that_onnxruntime_runs(bundle, name, sizes):
    options = _atc_options(bundle, name)
    assert options["input_format"] == "ND" and "input_shape_range" not in options
    shapes, profiles = _profiles(options)
    assert len(profiles) == np.prod([len(v) for v in sizes.values()])  # every combination, once
    assert all(len(row) == sum(s.count(-1) for _, s in shapes) for row in profiles)
    session = ort.InferenceSession(str(bundle / "components" / name / "model.onnx"))
    declared = {i.name: i.type for i in session.get_inputs()}
    assert [n for n, _ in shapes] == [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(0)
    for row in profiles:
        values = iter(row)
        feed = {}
        for input_name, shape in shapes:
            shape = [next(values) if d == -1 else d for d in shape]
            if declared[input_name] == "tensor(int64)":
                feed[input_name] = (np.ones(shape, np.int64) if "mask" in input_name
                                    else rng.integers(0, 12, shape).astype(np.int64))
            else:
                feed[input_name] = rng.standard_normal(shape).astype(np.float32)
        logits = session.run(["logits"], feed)[0]
        assert logits.shape[:2] == feed["input_ids"].shape and np.isfinite(logits).all()


def test_parity_ran_at_the_gears_and_validate_rederives_them(bundle):
    prefill = json.loads((bundle / "components" / "prefill" / "manifest.json").read_text())
    shapes = [r["shape"] for r in prefill["parity"]["shapes"]]
    assert {s["batch_size"] for s in shapes} == {1, 2, 4}
    assert {s["sequence_length"] for s in shapes} == {1, 2, 4, 7, 8, 12}
    decode = json.loads((bundle / "components" / "decode" / "manifest.json").read_text())
    assert {r["shape"]["past_sequence_length"] for r in decode["parity"]["shapes"]} == {4, 7, 8, 10}
    assert all(r["passed"] for r in prefill["parity"]["shapes"] + decode["parity"]["shapes"])
    assert cann_export.validate(bundle)["passed"] is True


def test_decode_masks_are_one_longer_than_the_past(bundle):
    shapes, profiles = _profiles(_atc_options(bundle, "decode"))
    slots = [(n, k) for n, s in shapes for k, d in enumerate(s) if d == -1]
    mask = slots.index(("attention_mask", 1))
    past = next(i for i, (n, k) in enumerate(slots) if re.fullmatch(r"past_key_values\.0\.key", n) and k == 2)
    assert all(row[mask] == row[past] + 1 for row in profiles)


def test_lint_checks_every_graph_with_its_own_options(bundle, tmp_path):
    import shutil

    from cann_export.hooks.manager import get_plugin_manager

    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group
    run = CliRunner().invoke(cli, ["lint", str(bundle), "--json"])
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert report["ok"] and set(report["components"]) == {"prefill", "decode"}
    assert all(not [f for f in r["findings"] if f["severity"] == "error"] for r in report["components"].values())
    text = CliRunner().invoke(cli, ["lint", str(bundle)]).output
    assert f"{bundle} [decode]: ATC lint passed" in text and f"{bundle} [prefill]: ATC lint passed" in text
    changed = tmp_path / "changed"
    shutil.copytree(bundle, changed)
    (changed / "components" / "decode" / "atc" / "convert.sh").write_text("atc --model=x\n")
    run = CliRunner().invoke(cli, ["lint", str(changed)])
    assert run.exit_code == 2 and "components/decode/atc/convert.sh" in run.output, run.output


@pytest.mark.parametrize("flags, words", [
    (["--atc-hint", "encoder:log=error"], "--atc-hint encoder:log: a text-generation-with-past export has no "
                                          "component 'encoder'"),
    (["--dynamic", "decoder_with_past:batch_size=1..4"], "has no component 'decoder_with_past'"),
])
def test_a_component_the_task_does_not_export_is_refused_before_the_load(tmp_path, flags, words):
    """The directory's task (from config.json) names the components: a prefix naming another is refused before
    transformers loads the model (its weights here are unreadable, so a load would fail differently)."""
    tiny_decoder_gpt2().save_pretrained(tmp_path / "gpt2-dir")
    (tmp_path / "gpt2-dir" / "model.safetensors").write_bytes(b"\0" * 64)
    run = CliRunner().invoke(cli, [str(tmp_path / "gpt2-dir"), "-o", str(tmp_path / "out"), *flags])
    assert run.exit_code == 2 and words in run.output, run.output
    assert not (tmp_path / "out").exists()
