"""Several graphs in one bundle: GPT-2 and Llama as prefill + decode (growing and fixed-length cache), T5 as
encoder + decoder + decoder_with_past. Each graph runs in onnxruntime, driven only by the bundle's own
connections, and a 4-token greedy generation equals transformers' generate(); validate, inspect and the zoo
re-derive every component; a tampered or missing component, or a connection naming an unknown output, is
refused (exit 2) naming the file."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import transformers
from click.testing import CliRunner

from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import ExportError, OptionsError
from helpers.bundle_runs import component_session, feeds_from, greedy_seq2seq, run_named
from helpers.hf_models import tiny_decoder_gpt2

STEPS = 4
OPTIONS = {"num_random_inputs": 1}


def _gpt2():
    return tiny_decoder_gpt2(n_positions=64)


def _llama():
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _t5():
    torch.manual_seed(2)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    return transformers.T5ForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("multigraph")
    models = {"gpt2": _gpt2(), "llama": _llama(), "t5": _t5()}
    out = {}
    for name in ("gpt2", "llama", "t5"):
        out[name] = (models[name], root / name, api.export_multi(models[name], root / name, **OPTIONS))
    # the fixed-length form from a save_pretrained directory, through the CLI
    models["gpt2"].save_pretrained(root / "gpt2-dir")
    res = CliRunner().invoke(cli, [str(root / "gpt2-dir"), "-o", str(root / "gpt2_static"), "--kv-cache", "static:16",
                                   "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out["gpt2_static"] = (models["gpt2"], root / "gpt2_static", json.loads(res.stdout))
    # --format onnx, no --task: a causal LM's default is text-generation-with-past (as in Optimum)
    res = CliRunner().invoke(cli, [str(root / "gpt2-dir"), "--format", "onnx", "-o", str(root / "gpt2_onnx"),
                                   "--json", "--trace", str(root / "gpt2_onnx.trace.json")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out["gpt2_onnx"] = (models["gpt2"], root / "gpt2_onnx", json.loads(res.stdout))
    return out




def _prompt(model, n=5):
    return torch.randint(1, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(7))


def _reference(model, ids, **kw):
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS,
                              do_sample=False, **kw)[0, -STEPS:].tolist()


def _decoder_generate(bundle, ids):
    manifest = json.loads((bundle / "manifest.json").read_text())
    prefill, decode = component_session(bundle, "prefill"), component_session(bundle, "decode")
    n = ids.shape[1]
    out = run_named(prefill, {"input_ids": ids.numpy(), "attention_mask": np.ones((1, n), np.int64),
                         "position_ids": np.arange(n, dtype=np.int64)[None]})
    tokens, source, logits = [], "prefill", []
    for step in range(STEPS):
        logits.append(out["logits"][:, -1])
        tokens.append(int(out["logits"][0, -1].argmax()))
        if step == STEPS - 1:
            break
        length = n + step
        past = feeds_from(manifest, source, "decode", out)
        out = run_named(decode, {"input_ids": np.array([[tokens[-1]]], np.int64),
                            "attention_mask": np.ones((1, length + 1), np.int64),
                            "position_ids": np.array([[length]], np.int64), **past})
        source = "decode"
    return tokens, logits


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_greedy_generation_through_prefill_and_decode_equals_generate(bundles, name):
    model, bundle, result = bundles[name]
    assert result.ok, result.to_dict()
    ids = _prompt(model)
    tokens, logits = _decoder_generate(bundle, ids)
    assert tokens == _reference(model, ids)
    with torch.no_grad():  # the last step's logits, against eager on the whole sequence
        full = torch.cat([ids, torch.tensor([tokens[:-1]])], 1)
        eager = model(full).logits[:, -1].numpy()
    np.testing.assert_allclose(logits[-1], eager, atol=1e-4)


def test_a_mixture_of_experts_directory_exports_graphs_that_generate(tmp_path):
    """Mixtral's default experts path (grouped_mm: a custom op, histc) exports nowhere, and its eager loop runs only
    the experts the example routes to: the directory's model is exported on batched_mm, whose graph routes any
    input (a 4-token greedy generation through prefill + decode equals transformers' generate)."""
    torch.manual_seed(3)
    cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64, eos_token_id=None)
    model = transformers.MixtralForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "moe")
    res = CliRunner().invoke(cli, [str(tmp_path / "moe"), "--format", "onnx", "-o", str(tmp_path / "out")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ids = _prompt(model)
    tokens, _ = _decoder_generate(tmp_path / "out", ids)
    assert tokens == _reference(model, ids)


def test_onnx_format_writes_validated_onnx_components_that_generate(bundles, tmp_path):
    """`cann-export DIR --format onnx` of a causal LM: prefill + decode as onnx_bundle components (each with its
    own fp32 parity, no ATC files), the top-level manifest and connections; generation through them equals
    generate(); validate and inspect re-derive it; convert says to export atc_ready."""
    model, bundle, result = bundles["gpt2_onnx"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] and result["format"] == "onnx" and manifest["format"] == "onnx"
    assert manifest["kind"] == "decoder-with-past" and "atc" not in manifest and not (bundle / "atc").exists()
    for name in ("prefill", "decode"):
        own = json.loads((bundle / "components" / name / "manifest.json").read_text())
        assert own["format"] == "onnx_bundle" and own["parity"]["passed"] is True and "device" not in own["parity"]
        assert not (bundle / "components" / name / "atc").exists()
        assert (bundle / "components" / name / "parity" / "inputs.safetensors").is_file()
    assert (bundle / "hf" / "config.json").is_file()
    timeline = json.loads(bundle.with_name("gpt2_onnx.trace.json").read_text())["traceEvents"]
    stages = {e["name"] for e in timeline if e.get("ph") == "X"}
    assert {"prefill:capture", "decode:capture", "prefill:validate", "decode:validate"} <= stages, stages
    ids = _prompt(model)
    assert _decoder_generate(bundle, ids)[0] == _reference(model, ids)
    check = CliRunner().invoke(cli, ["validate", str(bundle), "--json"], catch_exceptions=False)
    assert check.exit_code == 0, check.output
    assert set(json.loads(check.stdout)["components"]) == {"prefill", "decode"}
    shown = CliRunner().invoke(cli, ["inspect", str(bundle)], catch_exceptions=False)
    assert shown.exit_code == 0 and "onnx multi-graph bundle: decoder-with-past" in shown.output, shown.output
    from cann_export.hooks.manager import get_plugin_manager

    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group
    conv = CliRunner().invoke(cli, ["convert", str(bundle), "-o", str(tmp_path / "om")])
    assert conv.exit_code == 2 and "--format atc_ready" in " ".join(conv.output.split()), conv.output
    assert not (tmp_path / "om").exists()
    from cann.model_zoo import load_model
    from cann_export.model_zoo import zoo_api as zoo

    assert zoo.publish(str(bundle), name="gpt2-onnx", zoo=str(tmp_path / "zoo"))["targets"] == ["onnx"]
    assert api.validate(load_model("gpt2-onnx", framework="onnx", zoo=str(tmp_path / "zoo")))["passed"] is True


def test_no_validate_keeps_each_graphs_trace_checked_at_its_shapes(bundles, tmp_path):
    """--no-validate: each graph is traced first and the gate checks the trace on the sets a validating export
    builds (its shape sets too), so skipping parity is not slower than validating (dynamo was: GPT-2 small 62 s
    against 55 s); the graphs still generate as transformers does."""
    model, root = bundles["gpt2"][0], bundles["gpt2_onnx"][1].parent
    res = CliRunner().invoke(cli, [str(root / "gpt2-dir"), "--format", "onnx", "-o", str(tmp_path / "nv"),
                                   "--no-validate"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    for name in ("prefill", "decode"):
        own = json.loads((tmp_path / "nv" / "components" / name / "manifest.json").read_text())
        assert [a["exporter"] for a in own["capture"]["attempts"]] == ["torchscript"], own["capture"]
        checked = own["capture"]["specialized"]["checked"]
        assert checked["input_sets"] >= 5 and len(checked["shapes"]) >= 5, checked  # the range ends and middles
        assert own["parity"]["validated"] is False and not (tmp_path / "nv" / "components" / name / "parity").exists()
    ids = _prompt(model)
    assert _decoder_generate(tmp_path / "nv", ids)[0] == _reference(model, ids)


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(format="atc_ready"), "components/prefill/manifest.json format: 'onnx_bundle', not "
                                             "'atc_ready'"),
    (lambda m: m.update(format="om"), "manifest.json format: 'om' is not a format of multi-graph bundles"),
])
def test_onnx_bundle_claiming_another_format_is_refused(bundles, tmp_path, edit, words):
    bundle = _copy(bundles, tmp_path, "gpt2_onnx")
    _edit_manifest(bundle, edit)
    assert words in " ".join(_refused(bundle).split())


def test_decoder_graphs_have_optimum_names_and_symbolic_axes(bundles):
    _, bundle, _ = bundles["gpt2"]
    decode = onnx.load(str(bundle / "components" / "decode" / "model.onnx"), load_external_data=False)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in decode.graph.input}
    assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["attention_mask"] == ["batch_size", "past_sequence_length + 1"]
    assert [o.name for o in decode.graph.output] == ["logits"] + [f"present.{i}.{kv}" for i in range(2)
                                                                  for kv in ("key", "value")]
    script = (bundle / "components" / "decode" / "atc" / "convert.sh").read_text()
    # CANN 8 (the default --cann-version) takes the ranges in --input_shape itself; --input_shape_range is deprecated
    assert "--input_shape_range" not in script and "past_key_values.0.key:1~64,2,1~63,16" in script
    assert "--input_shape=" in script and "attention_mask:1~64,2~64" in script
    lint = json.loads((bundle / "components" / "decode" / "manifest.json").read_text())["lint"]
    assert "input_shape_range" not in json.dumps(lint)


def test_static_cache_runs_in_onnxruntime_and_matches_eager(bundles):
    model, bundle, result = bundles["gpt2_static"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] and manifest["run"]["cache_length"] == 16 and manifest["kind"] == "decoder-with-static-cache"
    assert (bundle / "hf" / "config.json").is_file() and "hf/config.json" in manifest["files"]
    from cann_export.sandbox import confine

    assert manifest["sandbox"]["kind"] == (confine.probe().kind if confine.probe().available else "none")
    prefill, decode = component_session(bundle, "prefill"), component_session(bundle, "decode")
    for s in (prefill, decode):  # every shape fixed: what ATC's static path needs
        assert all(isinstance(d, int) for v in (*s.get_inputs(), *s.get_outputs()) for d in v.shape)
    ids, length = _prompt(model), 16
    n = ids.shape[1]
    slots = np.concatenate([np.zeros((1, length - n), np.int64), np.ones((1, n), np.int64)], 1)
    padded = np.concatenate([np.zeros((1, length - n), np.int64), ids.numpy()], 1)
    out = run_named(prefill, {"input_ids": padded, "attention_mask": slots,
                         "position_ids": np.clip(slots.cumsum(-1) - 1, 0, None)})
    tokens, source = [], "prefill"
    for step in range(STEPS):
        tokens.append(int(out["logits"][0, -1].argmax()))
        if step == STEPS - 1:
            break
        past = feeds_from(manifest, source, "decode", out)
        out = run_named(decode, {"input_ids": np.array([[tokens[-1]]], np.int64),
                            "attention_mask": np.concatenate([slots, [[1]]], 1),
                            "position_ids": np.array([[n + step]], np.int64), **past})
        slots = np.concatenate([slots[:, 1:], [[1]]], 1)  # the window moved by one slot
        source = "decode"
    assert tokens == _reference(model, ids)
    with torch.no_grad():
        eager = model(torch.cat([ids, torch.tensor([tokens[:-1]])], 1)).logits[:, -1].numpy()
    np.testing.assert_allclose(out["logits"][:, -1], eager, atol=1e-4)


def test_t5_encoder_decoder_and_decoder_with_past_generate(bundles):
    model, bundle, result = bundles["t5"]
    assert result.ok, result.to_dict()
    manifest = result.manifest
    ids = _prompt(model, 6)
    mask = np.ones((1, 6), np.int64)
    tokens, _ = greedy_seq2seq(bundle, manifest, {"input_ids": ids.numpy(), "attention_mask": mask}, 0, STEPS,
                               {"encoder_attention_mask": mask})
    assert tokens == _reference(model, ids)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5"])
def test_every_atc_range_lies_on_a_symbolic_graph_dim(bundles, name):
    """Issue 19's report: T5's decoder declared 1~4096 on an axis its graph held fixed. Every component's ATC
    ranges now match its exported graph: a ``~`` cell on a named dim, the graph's size on a fixed one."""
    import onnx

    _, bundle, _ = bundles[name]
    for comp in json.loads((bundle / "manifest.json").read_text())["components"]:
        graph = onnx.load(str(bundle / comp["path"] / "model.onnx"), load_external_data=False)
        held = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
        own = json.loads((bundle / comp["path"] / "manifest.json").read_text())
        for part in own["atc"]["hints"]["input_shape"].split(";"):
            inp, _, cells = part.rpartition(":")
            for cell, dim in zip(cells.split(","), held[inp], strict=True):
                assert ("~" in cell) == isinstance(dim, str) and ("~" in cell or cell == str(dim)), (comp, part)


def test_no_if_node_and_a_verdict_per_component(bundles):
    for name, (_, bundle, _result) in bundles.items():
        if name == "gpt2_onnx":  # no device verdict, no ATC script: test_onnx_format_writes_validated_onnx_...
            continue
        top = json.loads((bundle / "manifest.json").read_text())
        assert top["schema"] == "cann-export/bundle/2" and top["parity"]["passed"] is True
        for comp in top["components"]:
            graph = onnx.load(str(bundle / comp["path"] / "model.onnx"), load_external_data=False)
            assert "If" not in {n.op_type for n in graph.graph.node}, (name, comp["name"])
            own = json.loads((bundle / comp["path"] / "manifest.json").read_text())
            assert own["parity"]["fp32"]["passed"] and own["parity"]["device"]["passed"], (name, comp["name"])
            assert own["parity"]["device"]["mode"] == "force_fp16"
            assert top["parity"]["components"][comp["name"]] is True
        script = (bundle / "atc" / "convert.sh").read_text()
        assert script.count("bash components/") == len(top["components"]) == len(top["parity"]["components"])


def test_validate_inspect_cli_and_zoo_round_trip(bundles, tmp_path):
    _, bundle, _ = bundles["gpt2"]
    runner = CliRunner()
    res = runner.invoke(cli, ["validate", str(bundle), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True and set(report["components"]) == {"prefill", "decode"}
    assert all(c["passed"] for c in report["components"].values())
    res = runner.invoke(cli, ["inspect", str(bundle)], catch_exceptions=False)
    assert res.exit_code == 0 and "decode" in res.output and "past_key_values.0.key" in res.output
    from cann_export.model_zoo import zoo_api as zoo

    zoo_dir = tmp_path / "zoo"
    published = zoo.publish(str(bundle), name="gpt2-kv", zoo=str(zoo_dir))
    loaded = zoo.load_model("gpt2-kv", framework="onnx", zoo=str(zoo_dir))
    assert api.validate(loaded)["passed"] is True
    assert zoo.verify("gpt2-kv", zoo=str(zoo_dir))["ok"] is True
    assert published["kinds"] == ["atc_ready"]


def _copy(bundles, tmp_path, name="gpt2"):
    dst = tmp_path / "copy"
    shutil.copytree(bundles[name][1], dst)
    return dst


def _refused(path):
    res = CliRunner().invoke(cli, ["validate", str(path)])
    assert res.exit_code == 2, res.output
    return res.output


def test_tampered_component_manifest_is_refused(bundles, tmp_path):
    bundle = _copy(bundles, tmp_path)
    f = bundle / "components" / "decode" / "manifest.json"
    data = json.loads(f.read_text())
    data["parity"]["passed"] = not data["parity"]["passed"]
    f.write_text(json.dumps(data))
    out = _refused(bundle)
    assert "components/decode/manifest.json" in out


def test_missing_component_is_refused(bundles, tmp_path):
    bundle = _copy(bundles, tmp_path)
    shutil.rmtree(bundle / "components" / "prefill")
    assert "components/prefill" in _refused(bundle)


def test_connection_to_an_unknown_output_is_refused(bundles, tmp_path):
    bundle = _copy(bundles, tmp_path)
    f = bundle / "manifest.json"
    data = json.loads(f.read_text())
    data["connections"][0]["from"]["output"] = "present.9.key"
    f.write_text(json.dumps(data))
    out = _refused(bundle)
    assert "present.9.key" in out and "manifest.json connections[0].from" in out
    with pytest.raises(ExportError):
        from cann_export.model_zoo import zoo_api as zoo

        zoo.publish(str(bundle), name="bad", zoo=str(tmp_path / "zoo"))


def test_bad_multi_options_are_refused_before_any_work(tmp_path):
    model = _gpt2()
    for kv in ("static:1", "static:x", "ring:4"):
        with pytest.raises(OptionsError, match="kv-cache"):
            api.export_multi(model, tmp_path / "x", kv_cache=kv)
    with pytest.raises(OptionsError, match="text-generation-with-past"):
        api.export_multi(model, tmp_path / "x", task="text2text-generation-with-past")
    with pytest.raises(OptionsError, match="in --format atc_ready or onnx"):  # om compiles one graph
        api.export_multi(model, tmp_path / "x", export_format="om")
    with pytest.raises(OptionsError, match="not x.onnx"):
        api.export_multi(model, tmp_path / "x.onnx", export_format="onnx")
    with pytest.raises(OptionsError, match="soc"):  # refused inside the first component: nothing left behind
        api.export_multi(model, tmp_path / "x", soc_version="Kirin990")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("edit, words", [
    (lambda m: m["components"][0].update(path="../../etc"), "components[0].path: not components/prefill"),
    (lambda m: m["components"][1].update(name="Decode; rm -rf"), "components[1]: no name of the form"),
    (lambda m: m["components"].append(dict(m["components"][0])), "'prefill' listed twice"),
    (lambda m: m["parity"].update(passed="yes"), "parity.passed"),
    (lambda m: m["parity"].update(components=["prefill"]), "parity.components: not a map"),  # was AttributeError
    (lambda m: m.update(kind=["decoder-with-past"]), "kind: missing or not a name"),  # was TypeError (unhashable)
    (lambda m: m.update(format={"x": 1}), "format: missing or not a name"),
])
def test_hostile_top_level_manifest_is_refused(bundles, tmp_path, edit, words):
    bundle = _copy(bundles, tmp_path)
    f = bundle / "manifest.json"
    data = json.loads(f.read_text())
    edit(data)
    f.write_text(json.dumps(data))
    assert words in " ".join(_refused(bundle).split())


def test_convert_runs_one_atc_command_per_graph(bundles, tmp_path, monkeypatch):
    import os

    from helpers.fake_atc import fake_atc, path_without_atc

    from cann_export.hooks.manager import get_plugin_manager

    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group
    bin_dir = fake_atc(tmp_path / "bin", tmp_path / "argv")
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_atc()]))
    _, bundle, _ = bundles["t5"]
    res = CliRunner().invoke(cli, ["convert", str(bundle), "-o", str(tmp_path / "om"), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)["components"]) == {"encoder", "decoder", "decoder_with_past"}
    oms = {p.stem: p.read_text() for p in (tmp_path / "om").glob("*.om")}
    assert set(oms) == {"encoder", "decoder", "decoder_with_past"}
    assert "past_key_values.1.encoder.value:" in oms["decoder_with_past"]
    assert "encoder_hidden_states:" in oms["decoder"] and "past_key_values" not in oms["encoder"]


def _edit_manifest(bundle, edit):
    f = bundle / "manifest.json"
    data = json.loads(f.read_text())
    edit(data)
    f.write_text(json.dumps(data))


def test_component_directory_moved_out_and_linked_back_is_refused(bundles, tmp_path):
    bundle = _copy(bundles, tmp_path)
    shutil.move(bundle / "components" / "decode", tmp_path / "outside")
    (bundle / "components" / "decode").symlink_to(tmp_path / "outside", target_is_directory=True)
    _edit_manifest(bundle, lambda m: m.update(files={k: v for k, v in m["files"].items()
                                                     if not k.startswith("components/decode/")}))
    out = " ".join(_refused(bundle).split())
    assert "components/decode: a link, not a directory inside the bundle" in out


@pytest.mark.parametrize("tamper, words", [
    (lambda b: (b / "components" / "prefill" / "extra.bin").write_bytes(b"x"),
     "components/prefill/extra.bin: not in the top-level file table"),
    (lambda b: (b / "components" / "prefill" / "peek").symlink_to("/etc/hostname"),
     "components/prefill/peek: a link inside a component"),
    (lambda b: (b / "components" / "spare").mkdir(), "components/spare: not a component of manifest.json"),
    (lambda b: _edit_manifest(b, lambda m: m["files"].pop("components/decode/model.onnx")),
     "components/decode/model.onnx: not in the top-level file table"),
])
def test_component_files_must_be_plain_and_listed_at_the_top(bundles, tmp_path, tamper, words):
    bundle = _copy(bundles, tmp_path)
    tamper(bundle)
    assert words in " ".join(_refused(bundle).split())


def _swap_key_value(m):
    for c in m["connections"]:
        if c["to"]["input"] == "past_key_values.0.key":
            c["to"]["input"] = "past_key_values.0.value"
        elif c["to"]["input"] == "past_key_values.0.value":
            c["to"]["input"] = "past_key_values.0.key"


@pytest.mark.parametrize("name, edit, words", [
    ("gpt2", _swap_key_value, "manifest.json connections: not the 8 that a decoder-with-past bundle"),
    ("gpt2", lambda m: m.update(kind="encoder-decoder"), "manifest.json components: ['prefill', 'decode']"),
    ("gpt2", lambda m: m.update(kind="decoder-with-static-cache"), "manifest.json run: not the run notes"),
    ("gpt2", lambda m: m["components"][1].update(role="prefill"), "with roles ['prefill', 'prefill']"),
    ("gpt2", lambda m: m["connections"].pop(), "manifest.json connections: not the 8"),
    ("gpt2_static", lambda m: m["run"].update(cache_length=8), "not the run notes of a decoder-with-static-cache "
                                                               "bundle with 16 cache slots"),
    ("t5", lambda m: m.update(components=m["components"][:2], connections=m["connections"][:1],
                              kind="encoder-decoder"), "manifest.json run"),
])
def test_wiring_kind_and_run_notes_are_re_derived(bundles, tmp_path, name, edit, words):
    bundle = _copy(bundles, tmp_path, name)
    _edit_manifest(bundle, edit)
    assert words in " ".join(_refused(bundle).split())


def test_confined_result_comes_from_the_checked_manifest_not_the_child(bundles, tmp_path, monkeypatch):
    from cann_export.pipeline import sandboxed_directory as confined
    from cann_export.bundle.multi_write import MultiResult
    from cann_export.sandbox import confine

    if not confine.probe().available:
        pytest.skip("no Landlock/seccomp here: the confined path does not run")
    source = bundles["gpt2"][1]

    def lying_child(path, output, *args, **kwargs):  # a hostile child: a good bundle, a false report
        shutil.copytree(source, output)
        return MultiResult(ok=False, output=str(output), kind="x", components={"evil": {"passed": False}})

    monkeypatch.setattr(confined, "_export", lying_child)
    result = confined.export_directory(tmp_path / "model", tmp_path / "out", None, (None, None, 7), None,
                                       {"sandbox": "require"})
    assert result.ok is True and set(result.components) == {"prefill", "decode"}
    assert all(c["passed"] for c in result.components.values())
    assert api.validate(tmp_path / "out")["passed"] is True
