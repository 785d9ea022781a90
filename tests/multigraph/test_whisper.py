"""Whisper as a multi-graph bundle: a save_pretrained directory exported with no flags is Optimum's
automatic-speech-recognition-with-past (encoder on ``input_features`` + decoder + decoder_with_past, no encoder
attention mask), a 4-token greedy generation through the ONNX graphs equals transformers' Whisper generate(),
``--task automatic-speech-recognition`` writes encoder + decoder only, validate / inspect / convert / the zoo
take the bundle, and a text task on Whisper is refused (exit 2, nothing written)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from helpers.bundle_runs import cli_export, component_session, feeds_from, greedy_seq2seq, run_named
from helpers.hf_models import WHISPER_MELS as MELS
from helpers.hf_models import WHISPER_SOURCE as SOURCE
from helpers.hf_models import tiny_whisper as _whisper

STEPS = 4


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    model = _whisper()
    model.save_pretrained(root / "whisper-dir")
    return {"model": model, "dir": root / "whisper-dir", "root": root,
            "past": (root / "past", cli_export(root / "whisper-dir", root / "past")),
            "nopast": (root / "nopast", cli_export(root / "whisper-dir", root / "nopast",
                                                "--task", "automatic-speech-recognition"))}




def _features():
    return torch.randn(1, MELS, 2 * SOURCE, generator=torch.Generator().manual_seed(5))


def _reference(model, features):
    """transformers' Whisper generate(): its generation_config here forces no task/language tokens (none saved),
    so after decoder_start_token_id the tokens are greedy argmaxes; eos off so all 4 come."""
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        return model.generate(features, max_new_tokens=STEPS, do_sample=False)[0, -STEPS:].tolist()


def test_default_is_with_past_and_greedy_generation_equals_generate(whisper):
    model, (bundle, result) = whisper["model"], whisper["past"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] is True and manifest["kind"] == "encoder-decoder-with-past"
    assert [c["name"] for c in manifest["components"]] == ["encoder", "decoder", "decoder_with_past"]
    features, start = _features(), model.config.decoder_start_token_id
    tokens, out = greedy_seq2seq(bundle, manifest, {"input_features": features.numpy()}, start, STEPS)
    assert tokens == _reference(model, features)
    assert len(set(tokens)) > 1  # the yardstick moves: a cache that is not read would show
    with torch.no_grad():  # the last step's logits, against eager on the whole prefix
        ids = torch.tensor([[start, *tokens[:-1]]])
        eager = model(input_features=features, decoder_input_ids=ids).logits[:, -1].numpy()
    np.testing.assert_allclose(out["logits"][:, -1], eager, atol=1e-4)


def test_graph_names_and_axes_are_optimums(whisper):
    bundle, _ = whisper["past"]

    def shapes(component, which="input"):
        graph = onnx.load(str(bundle / "components" / component / "model.onnx"), load_external_data=False).graph
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in (graph.input if which == "input" else graph.output)}

    # mel bins and Whisper's fixed 2 * max_source_positions frames stay static (conv weights, the encoder's check)
    assert shapes("encoder") == {"input_features": ["batch_size", MELS, 2 * SOURCE]}
    assert list(shapes("encoder", "output")) == ["last_hidden_state"]
    decoder = shapes("decoder")
    assert list(decoder) == ["input_ids", "encoder_hidden_states"]  # no encoder_attention_mask, as Optimum
    assert decoder["encoder_hidden_states"] == ["batch_size", "encoder_sequence_length", 32]
    step = shapes("decoder_with_past")
    assert list(step)[:3] == ["input_ids", "past_key_values.0.decoder.key", "past_key_values.0.decoder.value"]
    assert step["past_key_values.1.encoder.value"] == ["batch_size", 4, "encoder_sequence_length", 8]
    assert step["past_key_values.1.decoder.key"] == ["batch_size", 4, "past_decoder_sequence_length", 8]
    assert list(shapes("decoder_with_past", "output")) == ["logits"] + [
        f"present.{i}.decoder.{kv}" for i in range(2) for kv in ("key", "value")]
    # the traced cache grows by the new token under Optimum's name: left to the tracer ("Concatpresent..._dim_2"),
    # validate counted it as 1 where export counted past + 1, and a real Whisper's budget record was refused
    assert shapes("decoder_with_past", "output")["present.1.decoder.value"] == [
        "batch_size", 4, "past_decoder_sequence_length + 1", 8]
    script = (bundle / "components" / "encoder" / "atc" / "convert.sh").read_text()
    assert f"input_features:1~64,{MELS},{2 * SOURCE}" in script
    # the encoder's length (max_source_positions) bounds encoder_sequence_length, not the decoder's table
    assert f"encoder_hidden_states:1~64,1~{SOURCE},32" in (bundle / "components" / "decoder" / "atc" /
                                                          "convert.sh").read_text()
    assert (bundle / "hf" / "config.json").is_file() and (bundle / "hf" / "generation_config.json").is_file()


def test_task_without_past_is_encoder_and_decoder(whisper):
    model, (bundle, result) = whisper["model"], whisper["nopast"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] is True and manifest["kind"] == "encoder-decoder"
    assert [c["name"] for c in manifest["components"]] == ["encoder", "decoder"]
    assert manifest["run"] == {"loop": "decoder", "logits": "logits", "cache": "none"}
    features = _features()
    enc = run_named(component_session(bundle, "encoder"), {"input_features": features.numpy()})
    hidden = feeds_from(manifest, "encoder", "decoder", enc)
    decoder, ids = component_session(bundle, "decoder"), [model.config.decoder_start_token_id]
    for _ in range(STEPS):  # the decoder re-reads the whole prefix each step
        out = run_named(decoder, {"input_ids": np.array([ids], np.int64), **hidden})
        ids.append(int(out["logits"][0, -1].argmax()))
    assert ids[1:] == _reference(model, features)


def test_validate_inspect_and_convert_take_the_bundle(whisper, tmp_path, monkeypatch):
    import os

    from helpers.fake_atc import fake_atc, path_without_atc

    from cann_export.hooks.manager import get_plugin_manager

    bundle, _ = whisper["past"]
    runner = CliRunner()
    res = runner.invoke(cli, ["validate", str(bundle), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True and set(report["components"]) == {"encoder", "decoder", "decoder_with_past"}
    res = runner.invoke(cli, ["inspect", str(bundle)], catch_exceptions=False)
    assert res.exit_code == 0 and "input_features" in res.output
    from cann_export.model_zoo import zoo_api as zoo

    assert zoo.publish(str(bundle), name="whisper-kv", zoo=str(tmp_path / "zoo"))["kinds"] == ["atc_ready"]
    assert zoo.verify("whisper-kv", zoo=str(tmp_path / "zoo"))["ok"] is True
    get_plugin_manager().hook.register_commands(cli=cli)
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_atc(tmp_path / "bin", tmp_path / "argv")),
                                                path_without_atc()]))
    res = runner.invoke(cli, ["convert", str(bundle), "-o", str(tmp_path / "om"), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    oms = {p.stem: p.read_text() for p in (tmp_path / "om").glob("*.om")}
    assert set(oms) == {"encoder", "decoder", "decoder_with_past"}
    assert "input_features:" in oms["encoder"] and "encoder_attention_mask" not in oms["decoder"]


def test_text_task_on_whisper_is_refused(whisper, tmp_path):
    out = tmp_path / "x"
    res = CliRunner().invoke(cli, [str(whisper["dir"]), "-o", str(out), "--task", "text2text-generation"])
    assert res.exit_code == 2, res.output
    words = " ".join(res.output.split())
    assert "--task text2text-generation is not a task of WhisperForConditionalGeneration" in words
    assert "automatic-speech-recognition-with-past" in words
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OptionsError, match="automatic-speech-recognition"):  # in memory: the same answer
        api.export_multi(whisper["model"], out, task="text2text-generation-with-past")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch, task", [("WhisperForConditionalGeneration", "automatic-speech-recognition-with-past"),
                                        ("T5ForConditionalGeneration", "text2text-generation-with-past"),
                                        ("GPT2LMHeadModel", "text-generation-with-past"),
                                        ("Wav2Vec2ForCTC", "automatic-speech-recognition")])
def test_default_task_is_optimums(arch, task):
    """No --task: the -with-past form where the class has one (Optimum's rule); a CTC model stays one graph."""
    from cann_export.hf.tasks import detect

    assert detect({"architectures": [arch]}, None)[1].name == task
    if task.endswith("-with-past"):
        plain = task.removesuffix("-with-past")
        assert detect({"architectures": [arch]}, plain)[1].name == plain


def test_each_decoder_set_runs_at_the_encoder_length_its_label_names():
    """Whisper's encoder gives its fixed window's positions (``max_source_positions``) whatever the decoder's
    ``encoder_sequence_length``: a decoder set labelled with another length is fed ``encoder_hidden_states`` of that
    length (drawn), so it runs at the shape its label names (it was the encoder's 16 at 1, 8, ...)."""
    from cann_export.bundle.graph_shapes import shape_sets
    from cann_export.hf.graph_plans import plan_for

    plan = plan_for(_whisper())
    checked = 0
    for comp in plan.components[1:]:
        make = shape_sets(plan, comp, {})
        _, found, _, _ = make(0)
        for point, sets in found:
            for feed in sets:
                for name, tensor in feed.items():
                    if name == "encoder_hidden_states" or name.endswith(".encoder.key"):
                        axis = 1 if name == "encoder_hidden_states" else 2
                        assert tensor.shape[axis] == point["encoder_sequence_length"], (comp.name, name, point)
                        checked += point["encoder_sequence_length"] != SOURCE
    assert checked  # some sets run at another encoder length than the encoder's own


def test_no_validate_probes_only_the_graphs_that_warned_on_a_value(whisper, tmp_path):
    """--no-validate: a component's path probes wait for its trace, as a validating export's do. The encoder warns
    only at tests of sizes (sdpa's ``is_causal = query.shape[2] > 1 ...``), so it is gated at its sizes with no
    probe (it was probed in prepare: 4 eager forwards and 4 onnxruntime runs of the window); a graph whose trace
    warned on a value still gets its probes."""
    res = CliRunner().invoke(cli, [str(whisper["dir"]), "--format", "onnx", "-o", str(tmp_path / "nv"),
                                   "--no-validate"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    probed = {}
    for name in ("encoder", "decoder", "decoder_with_past"):
        own = json.loads((tmp_path / "nv" / "components" / name / "manifest.json").read_text())
        specialized = own["capture"].get("specialized") or {}
        if "checked" in specialized:
            probed[name] = specialized["checked"]["path_variants"]
            assert probed[name] == (0 if "probes" in specialized else 4), (name, specialized)
    assert probed.get("encoder") == 0, probed
