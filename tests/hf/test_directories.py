"""Hugging Face model directories (save_pretrained, tiny configs, random weights) exported through the CLI with
no flags but --task where detection picks a multi-graph task: Optimum's input/output names, the graph in
onnxruntime against transformers' eager outputs; the bundle carries config and tokenizer files; every bad
directory is refused with exit 2 and nothing written."""
import hashlib
import json
import os
import struct

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import hf_dirs

from cann_export.cli.main import cli

ONNX_TYPES = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32"}


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _sizes(value):
    """A graph input's sizes: a symbolic (dynamic) axis gets 3 (batch) or 8 (raw audio: 1000 samples), other than
    the export's example."""
    dims = value.type.tensor_type.shape.dim
    longer = 1000 if value.name == "input_values" else 8
    return [d.dim_value if d.dim_value > 0 else (3 if k == 0 else longer) for k, d in enumerate(dims)]


class _Saved(dict):
    """name -> the directory of ``hf_dirs.CASES[name]``, saved on first use (read only: a test that edits one
    edits its own copy, hf_dirs.copy_saved)."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, name):
        self[name] = hf_dirs.save(name, self.root / name)
        return self[name]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _Saved(tmp_path_factory.mktemp("saved"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, saved):
    """name -> (model directory, exported .onnx), each exported once for the module."""
    root = tmp_path_factory.mktemp("hf")
    cache = {}

    def get(name):
        if name not in cache:
            directory = saved[name]
            out = root / f"{name}.onnx"
            case = hf_dirs.CASES[name]
            result = invoke([directory, "--format", "onnx", "-o", out, *(["--task", case.task] if case.flag else [])])
            assert result.exit_code == 0, result.output
            cache[name] = (directory, out)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(hf_dirs.CASES))
def test_directory_exports_with_optimum_names_and_matches_transformers(name, exported, run_ort):
    case = hf_dirs.CASES[name]
    directory, out = exported(name)
    graph = onnx.load(str(out), load_external_data=False)
    assert [i.name for i in graph.graph.input] == case.inputs
    assert [o.name for o in graph.graph.output] == case.outputs
    props = {p.key: p.value for p in graph.metadata_props}
    assert props["cann_export.task"] == case.task and props["cann_export.source_kind"] == "module"
    shapes = {i.name: (_sizes(i), ONNX_TYPES[i.type.tensor_type.elem_type]) for i in graph.graph.input}
    assert all(kind == "int64" for n, (_, kind) in shapes.items() if n in ("input_ids", "attention_mask"))
    feeds = hf_dirs.feeds_like(shapes, case.kwargs.get("vocab_size") or case.kwargs.get("text_config", {}).get(
        "vocab_size", 2))
    names, got = run_ort(out, feeds)
    want = hf_dirs.eager(name, directory, feeds)
    for n, value in zip(names, got, strict=True):
        np.testing.assert_allclose(value, want[n], atol=2e-4, rtol=1e-3, err_msg=f"{name}: {n}")


def test_raw_audio_length_is_dynamic_from_the_feature_encoders_receptive_field(exported):
    """Wav2Vec2's input_values: batch and length symbolic (Optimum's axes), the length's range starting at the conv
    feature encoder's receptive field (10 + 3 x 5 samples for this config's kernels 10, 4 and strides 5, 4)."""
    from cann_export.hf.dummy_inputs import receptive_field

    _, out = exported("wav2vec2")
    dims = onnx.load(str(out), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch_size", "sequence_length"]
    assert receptive_field({"conv_kernel": [10, 4], "conv_stride": [5, 4]}) == 25
    assert receptive_field({"conv_kernel": [10, 3, 3, 3, 3, 2, 2], "conv_stride": [5, 2, 2, 2, 2, 2, 2]}) == 400


def _tokenizer_files(directory):
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                   + [f"w{i}" for i in range(95)]) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 64}))
    (directory / "notes.md").write_text("not carried: not on the allow-list")


def _hub_cache(tmp_path, name="bert"):
    """A hub-cache repo folder (models--org--tiny-bert): blobs, one snapshot of links into them, refs/main."""
    repo = tmp_path / "hub" / "models--org--tiny-bert"
    plain = hf_dirs.save(name, tmp_path / "plain", max_shard_size="40KB")  # sharded: an index and several files
    _tokenizer_files(plain)
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for i, f in enumerate(sorted(plain.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        f.rename(blob)
        os.symlink(os.path.relpath(blob, repo / "snapshots" / commit), repo / "snapshots" / commit / f.name)
    return repo, commit


def test_hub_cache_snapshot_exports_an_atc_ready_bundle_carrying_config_and_tokenizer(tmp_path, monkeypatch):
    repo, commit = _hub_cache(tmp_path)
    snapshot = repo / "snapshots" / commit
    assert len([p for p in snapshot.iterdir() if p.name.endswith(".safetensors")]) > 1
    monkeypatch.chdir(tmp_path)
    result = invoke([repo, "--json"])  # no flags: the repo folder, refs/main's snapshot, the default name
    assert result.exit_code == 0, result.output
    out = tmp_path / "tiny-bert_atc_ready"
    manifest = json.loads((out / "manifest.json").read_text())
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        assert (out / "hf" / name).read_bytes() == (snapshot / name).read_bytes()
        assert f"hf/{name}" in manifest["files"]
    assert not (out / "hf" / "notes.md").exists() and not (out / "hf" / "model.safetensors.index.json").exists()
    assert manifest["provenance"]["task"] == "text-classification"
    # source_sha256 is over what the export read: each weights shard and each carried file, by name and sha256
    digest = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    lines = [f"{p.name} {digest(p.read_bytes())}" for p in snapshot.iterdir() if p.name.endswith(".safetensors")]
    lines += [f"{name} {digest((out / name).read_bytes())}" for name in manifest["files"] if name.startswith("hf/")]
    assert manifest["provenance"]["source_sha256"] == digest("\n".join(sorted(lines)).encode())
    assert [i["name"] for i in manifest["model"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert manifest["parity"]["passed"] is True
    from cann_export.sandbox import confine

    if confine.probe().available:  # the directory was read by the confined child
        assert manifest["sandbox"]["kind"] == "landlock+seccomp"
    check = invoke(["validate", out, "--json"])
    assert check.exit_code == 0, check.output
    (out / "hf" / "vocab.txt").write_text("tampered\n")  # a carried file is in the file table: validate sees it
    assert invoke(["validate", out]).exit_code == 2


def test_a_two_tower_model_writes_and_validates_an_atc_ready_bundle(tmp_path, saved):
    """CLIP's logits_per_text is the transpose of logits_per_image: at batch 1 the two outputs are one [1, 1]
    buffer, which the bundle's parity store must still save (safetensors refuses shared memory)."""
    result = invoke([saved["clip"], "-o", tmp_path / "out"])  # the default format: atc_ready, parity data stored
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    batches = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in graph.graph.input}
    # any number of texts against any number of images: Optimum's two batch axes, judged where they differ
    assert batches == {"input_ids": "text_batch_size", "attention_mask": "text_batch_size",
                       "pixel_values": "image_batch_size"}
    shapes = [s["shape"] for s in manifest["parity"]["shapes"]]
    assert {"text_batch_size": 1, "image_batch_size": 2} in [{k: s[k] for k in batches.values()} for s in shapes]
    assert any(s["image_batch_size"] == 16 and s["text_batch_size"] == 2 for s in shapes)
    check = invoke(["validate", tmp_path / "out"])
    assert check.exit_code == 0, check.output


def test_a_state_space_decoder_is_refused_with_past_naming_its_cache(tmp_path):
    """Mamba's cache is a recurrent state, not keys and values: no prefill + decode graphs, a clean refusal."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=1,
                                   expand=2, conv_kernel=4)
    transformers.MambaForCausalLM(cfg).eval().save_pretrained(tmp_path / "mamba")
    result = invoke([tmp_path / "mamba", "-o", tmp_path / "out"])
    assert result.exit_code == 2 and "Traceback" not in result.output and "[internal]" not in result.output
    assert "not attention keys and values" in result.stderr and "--task text-generation" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_eos_rule_leaves_what_the_user_gave_and_rows_already_right():
    """One eos per row goes only into sets the tool drew whose rows disagree: an MNLI pair's three per row, the
    user's own example and --parity-data are left as they are."""
    from types import SimpleNamespace

    from cann_export.inputs import eos_rows

    ctx = SimpleNamespace(loaded=SimpleNamespace(extras={eos_rows.KEY: 2, "hf": {"dummy_inputs": [
        {"name": "input_ids", "high": 50}]}}))
    pair = torch.tensor([[0, 7, 2, 2, 9, 2], [0, 8, 2, 2, 5, 2]])
    drawn = torch.tensor([[2, 7, 2, 4, 9, 1], [3, 8, 6, 4, 5, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    sets = [{"input_ids": pair}, {"input_ids": drawn, "attention_mask": mask}, {"input_ids": drawn.clone()}]
    labels = [{"source": "example"}, {"source": "random"}, {"source": "parity_data"}]
    eos_rows.place(ctx, eos_rows.drawn(sets, labels, example_drawn=False))
    assert sets[0]["input_ids"] is pair and torch.equal(sets[2]["input_ids"], drawn)
    fixed = sets[1]["input_ids"]
    assert fixed.tolist() == [[3, 7, 3, 4, 9, 2], [3, 8, 6, 2, 5, 1]] and drawn[0, 0] == 2  # a new tensor
    assert eos_rows.eos_pooled({"is_encoder_decoder": True, "eos_token_id": 99, "vocab_size": 99},
                               "text-classification") is None  # outside the vocabulary: no rule


# slow (-m slow, CI's step after the README's command): a second atc_ready CLIP export, 4 CPU-s; CLIP's directory
# export stays in the README's command (the two-tower test above and test_directory_exports_...[clip])
@pytest.mark.slow
def test_zero_shot_batches_stay_one_axis_for_a_cann_7_target(tmp_path, saved):
    """Under CANN < 8 every combination of gears is an ATC profile: CLIP keeps one batch_size there."""
    result = invoke([saved["clip"], "-o", tmp_path / "out", "--cann-version", "7.0"])
    assert result.exit_code == 0, result.output
    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert {i.type.tensor_type.shape.dim[0].dim_param for i in graph.graph.input} == {"batch_size"}


def test_an_encoder_decoder_classifier_gets_one_eos_per_row_in_every_set(tmp_path, run_ort):
    """BartForSequenceClassification pools at the eos token and refuses rows with different counts of it: every
    drawn set (example, variants, shape sets) holds one per row, so the directory exports with no flags."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BartConfig(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37,
                                  decoder_ffn_dim=37, max_position_embeddings=64, num_labels=3)
    model = transformers.BartForSequenceClassification(cfg).eval()
    model.save_pretrained(tmp_path / "bart")
    result = invoke([tmp_path / "bart", "-o", tmp_path / "out"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["provenance"]["task"] == "text-classification" and manifest["parity"]["passed"] is True
    assert manifest["parity"]["input_sets"] > 3 and len(manifest["parity"]["shapes"]) > 1
    assert invoke(["validate", tmp_path / "out"]).exit_code == 0
    ids = torch.randint(3, 99, (3, 9), generator=torch.Generator().manual_seed(5))
    ids[:, -1] = cfg.eos_token_id  # as a tokenizer writes it
    mask = torch.ones_like(ids)
    _, got = run_ort(tmp_path / "out" / "model.onnx", {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits.numpy()
    np.testing.assert_allclose(got[0], want, atol=2e-4, rtol=1e-3)


def test_a_seq2seq_model_the_task_dummies_do_not_fit_is_refused_not_an_internal_error(tmp_path):
    """Speech2Text takes frames-first features, not Whisper's mel-first dummies: the plan's forward failure is the
    model's, named with the inputs it got (exit 2, nothing written), never an internal error."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Speech2TextConfig(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37,
                                         decoder_ffn_dim=37, max_source_positions=64, max_target_positions=32,
                                         input_feat_per_channel=16, conv_channels=16)
    transformers.Speech2TextForConditionalGeneration(cfg).eval().save_pretrained(tmp_path / "s2t")
    result = invoke([tmp_path / "s2t", "-o", tmp_path / "out"])
    assert result.exit_code == 2 and "[internal]" not in result.output and "Traceback" not in result.output
    assert "the model's encoder failed on the task's example inputs (input_features" in result.stderr
    assert not (tmp_path / "out").exists()


def test_in_memory_transformers_model_takes_the_directory_path(exported, tmp_path):
    """cann.torch.export(model=<PreTrainedModel>) without inputs: the same task, names and dummy inputs."""
    import transformers

    import cann

    directory, from_dir = exported("distilbert")
    model = transformers.DistilBertForQuestionAnswering.from_pretrained(str(directory))
    out = tmp_path / "mem.onnx"
    result = cann.torch.export(model=model, output_path=str(out), export_format="onnx")
    assert result.ok
    a, b = onnx.load(str(out)), onnx.load(str(from_dir))
    for graph_a, graph_b in ((a.graph.input, b.graph.input), (a.graph.output, b.graph.output)):
        assert [v.name for v in graph_a] == [v.name for v in graph_b]
    assert [v.name for v in a.graph.output] == ["start_logits", "end_logits"]


def _no_config(d):
    (d / "config.json").unlink()


def _diffusers(d):
    (d / "config.json").unlink()
    (d / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))


def _edit_config(**changes):
    def edit(d):
        config = json.loads((d / "config.json").read_text())
        config.update(changes)
        (d / "config.json").write_text(json.dumps(config))
    return edit


def _no_weights(d):
    (d / "model.safetensors").unlink()


def _truncated(d):
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _missing_shard(d):  # the index is what transformers loads only where no model.safetensors is
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))


def _escaping_shard(d):
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/x.safetensors"}}))


def _pickled(d):
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def _huge(d):
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "pad": "x" * (2 << 20)}))


def _deep(d):
    (d / "config.json").write_text('{"model_type": "bert", "a": ' + "[" * 5000 + "]" * 5000 + "}")


def _header_lies(d):
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


def _link_out(d):
    outside = d.parent / "secret.txt"
    outside.write_text("not the model's")
    os.symlink(outside, d / "tokenizer.json")


BAD = {
    "no_config": (_no_config, [], "not a transformers model: there is no config.json"),
    "diffusers": (_diffusers, [], "diffusers pipeline"),
    "no_task_arch": (_edit_config(architectures=["MyCustomNet"]), [], "'MyCustomNet' is not a transformers class"),
    "task_unsupported": (lambda d: None, ["--task", "image-classification"],
                         "it does: text-classification, feature-extraction"),
    "task_unknown": (lambda d: None, ["--task", "translation"], "is not a task name"),
    "no_weights": (_no_weights, [], "no weights"),
    "truncated": (_truncated, [], "truncated"),
    "header_lies": (_header_lies, [], "header claims"),
    "missing_shard": (_missing_shard, [],
                      "model-00001-of-00002.safetensors, model-00002-of-00002.safetensors are missing"),
    "escaping_shard": (_escaping_shard, [], "not a plain *.safetensors file name"),
    "pickled": (_pickled, [], "pytorch_model.bin) and no model.safetensors is there; unpickling can run code"),
    "remote_code": (_edit_config(auto_map={"AutoModel": "modeling_evil.EvilModel"}), [], "--trust-remote-code"),
    "huge_config": (_huge, [], "larger than 1048576 bytes"),
    "deep_config": (_deep, [], "nests"),
    "wrong_type": (_edit_config(vocab_size="100"), [], "vocab_size is \"100\"; it must be an integer from 1"),
    "sub_config_type": (_edit_config(text_config=[1]), [], "text_config is [1], not an object"),
    "sub_config_field": (_edit_config(vision_config={"image_size": -3}), [], "vision_config.image_size is -3"),
    "archs_not_list": (_edit_config(architectures="BertModel"), [], "not a list of class names"),
    "link_out": (_link_out, [], "links outside the model directory"),
    "config_outgrows_weights": (_edit_config(num_hidden_layers=40, hidden_size=256, intermediate_size=1024,
                                             num_attention_heads=4), [], "the weight files hold"),
    "multi_graph": (_edit_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"),  # with past by default
                    ["--format", "om"], "exports several graphs, as a bundle directory of components in --format"),
    "multi_graph_suffix": (_edit_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
                           ["--task", "text-generation-with-past"], "a multi-graph bundle is a directory, or one "
                                                                     "file named .zip"),
    # the command that wrote one out.onnx before the with-past default: the refusal names the --task for one file
    "multi_graph_default_to_file": (_edit_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"), [],
                                    "with no --task, DIR exports as text-generation-with-past (the -with-past form, "
                                    "as Optimum does, since config.json's use_cache is not false): several graphs, "
                                    "written as a bundle directory, not the file out.onnx. Pass an output without a "
                                    "suffix for the bundle; pass --task text-generation for one graph (no cache) in "
                                    "out.onnx"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_directories_are_refused_naming_the_file_and_the_fix(case, tmp_path, saved):
    mutate, flags, expected = BAD[case]
    directory = hf_dirs.copy_saved(saved, "bert", tmp_path)
    mutate(directory)
    before = set(tmp_path.iterdir())
    result = invoke([directory, "--format", "onnx", "-o", tmp_path / "out.onnx", *flags])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split()).replace(str(directory), "DIR")
    assert expected in message, message
    assert ("[options]" if case.startswith("multi_graph") else "[load]") in message and "Traceback" not in result.output
    assert set(tmp_path.iterdir()) == before  # nothing written, no staging left behind


def test_python_api_exports_a_directory_with_pickled_weights_only_when_trusted(tmp_path, run_ort):
    import cann_export

    directory = hf_dirs.save("roberta", tmp_path / "roberta")
    _pickled(directory)
    out = tmp_path / "r.onnx"
    with pytest.raises(cann_export.ExportError, match="trust_pickle=True"):
        cann_export.export(str(directory), out, export_format="onnx")
    assert not out.exists()
    result = cann_export.export(str(directory), out, export_format="onnx", trust_pickle=True, validate=False,
                                input_shapes=["input_ids:1,24", "attention_mask:1,24"])  # the user's shapes win
    assert result.onnx["path"] == str(out)
    graph = onnx.load(str(out))
    assert [(i.name, _sizes(i), ONNX_TYPES[i.type.tensor_type.elem_type]) for i in graph.graph.input] == [
        ("input_ids", [1, 24], "int64"), ("attention_mask", [1, 24], "int64")]  # a mask stays int64, as Optimum's
    shapes = {i.name: (_sizes(i), "int64") for i in graph.graph.input}
    feeds = hf_dirs.feeds_like(shapes, 100)
    names, got = run_ort(out, feeds)
    np.testing.assert_allclose(got[0], hf_dirs.eager("roberta", directory, feeds)["logits"], atol=2e-4, rtol=1e-3)


REMOTE_CONFIG = '''from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, vocab_size=50, hidden_size=16, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        super().__init__(**kwargs)
'''
REMOTE_MODEL = '''import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_tiny import TinyConfig


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, return_dict=True):
        h = torch.tanh(self.proj(self.emb(input_ids)))
        return BaseModelOutput(last_hidden_state=h * attention_mask[..., None])
'''


def test_remote_code_runs_only_with_trust_remote_code_and_a_task(tmp_path, run_ort):
    import torch
    from safetensors.torch import save_file

    d = tmp_path / "remote"
    d.mkdir()
    (d / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (d / "modeling_tiny.py").write_text(REMOTE_MODEL)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["TinyModel"], "model_type": "tiny_remote", "vocab_size": 50, "hidden_size": 16,
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}}))
    g = torch.Generator().manual_seed(0)
    weights = {"emb.weight": torch.randn(50, 16, generator=g), "proj.weight": torch.randn(16, 16, generator=g),
               "proj.bias": torch.randn(16, generator=g)}
    save_file(weights, str(d / "model.safetensors"))
    out = tmp_path / "remote.onnx"
    refused = invoke([d, "--format", "onnx", "-o", out, "--task", "feature-extraction"])
    assert refused.exit_code == 2 and "auto_map" in refused.output and "--trust-remote-code" in refused.output
    no_task = invoke([d, "--format", "onnx", "-o", out, "--trust-remote-code"])
    assert no_task.exit_code == 2 and "pass --task too" in " ".join(no_task.output.split())
    assert not out.exists()
    result = invoke([d, "--format", "onnx", "-o", out, "--trust-remote-code", "--task", "feature-extraction"])
    assert result.exit_code == 0, result.output
    ids = torch.randint(0, 50, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, -4:] = 0
    names, got = run_ort(out, {"input_ids": ids, "attention_mask": mask})
    want = torch.tanh(weights["emb.weight"][ids] @ weights["proj.weight"].T + weights["proj.bias"]) * mask[..., None]
    assert names == ["last_hidden_state"]
    np.testing.assert_allclose(got[0], want.numpy(), atol=1e-5)
    assert not list((tmp_path / "remote").glob("__pycache__"))  # nothing was written into the model directory


def test_a_plugin_loader_reads_directories_through_matches_directory(plugin, tmp_path):
    """The core hands a directory to the first loader whose optional ``matches_directory`` takes it (the Hugging
    Face loader is one such plugin); a directory no loader takes is refused."""
    from helpers.toy_models import make_mlp

    import cann_export
    from cann_export import LoadedModel, hookimpl

    class MlpDirectory:
        name = "mlp-dir"
        priority = 500

        def matches(self, path):
            return False

        def matches_directory(self, path):
            return (path / "hidden.txt").is_file()

        def load(self, path, options):
            return LoadedModel(make_mlp(hidden=int((path / "hidden.txt").read_text())), "module",
                               source_sha256="0" * 64)

    @hookimpl
    def register_loaders(register):
        register(MlpDirectory())

    plugin({"register_loaders": register_loaders}, "mlp-dir")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "hidden.txt").write_text("16")
    result = cann_export.export(str(tmp_path / "m"), tmp_path / "m.onnx", export_format="onnx",
                                input_shapes=["x:1,12"], validate=False)
    assert result.manifest["provenance"]["source"] == str(tmp_path / "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(cann_export.ExportError, match="is a directory but not a model directory any loader reads"):
        cann_export.export(str(tmp_path / "empty"), tmp_path / "e.onnx", export_format="onnx")


def test_default_output_name_of_a_directory_keeps_its_whole_name(tmp_path):
    from cann_export.cli.main import _default_output

    (tmp_path / "Qwen2.5-0.5B").mkdir()
    snapshot = tmp_path / "models--org--tiny.v2" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert _default_output(str(tmp_path / "Qwen2.5-0.5B") + "/", "onnx") == "Qwen2.5-0.5B.onnx"
    assert _default_output(str(snapshot), "atc_ready") == "tiny.v2_atc_ready"
    assert _default_output("m.pt2", "onnx") == "m.onnx"


@pytest.mark.parametrize("arch, config, task", [
    ("GPT2LMHeadModel", {}, "text-generation-with-past"),  # use_cache absent: transformers' default, true
    ("LlamaForCausalLM", {"use_cache": True}, "text-generation-with-past"),
    ("Qwen2ForCausalLM", {"use_cache": False}, "text-generation"),  # no cache: the single graph, as Optimum
    ("T5ForConditionalGeneration", {}, "text2text-generation-with-past"),
    # BART is in transformers' masked-LM table too (its denoising objective): a seq2seq model all the same
    ("BartForConditionalGeneration", {}, "text2text-generation-with-past"),
    ("BertForMaskedLM", {}, "fill-mask"),
    ("BertForSequenceClassification", {"use_cache": True}, "text-classification"),  # no -with-past form
])
def test_default_task_is_with_past_when_the_model_keeps_a_cache(arch, config, task):
    from cann_export.hf.tasks import detect

    assert detect({"architectures": [arch], **config}, None)[1].name == task
    explicit = "text-generation" if "CausalLM" in arch or "LMHead" in arch else task
    assert detect({"architectures": [arch], **config}, explicit)[1].name == explicit  # --task decides
    assert detect({"architectures": [arch]}, None, with_past=False)[1].name == task.replace("-with-past", "")


def test_the_core_asks_the_loaders_whether_an_export_is_several_graphs(plugin, tmp_path, saved):
    """api.export reaches the multi-graph path through the Loader contract's optional ``graphs`` (highest
    priority first), never by naming the Hugging Face loader; a directory's default follows detection."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from cann_export import api, hookimpl
    from cann_export.hooks.contracts import Loader, optional

    gpt2 = saved["gpt2"]
    assert api.graphs(str(gpt2), {}) == "text-generation-with-past"
    assert api.graphs(str(gpt2), {"task": "text-generation"}) is None
    assert api.graphs(str(gpt2), {"task": "text-generation", "kv_cache": "static:8"}) == "auto"
    assert api.graphs(str(hf_dirs.copy_saved(saved, "bert", tmp_path)), {}) is None
    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50))
    assert api.graphs(model, {}) is None  # in memory: one graph unless asked
    assert api.graphs(model, {"task": "text-generation-with-past"}) == "text-generation-with-past"

    class Claims:
        name, priority = "claims", 1000

        def matches(self, path):
            return False

        def load(self, path, options):
            raise AssertionError("not loaded")

        def graphs(self, source, options):
            return "text2text-generation-with-past" if str(source).endswith("bert") else None

    @hookimpl
    def register_loaders(register):
        register(Claims())

    plugin({"register_loaders": register_loaders}, "claims")
    assert optional(Claims(), Loader, "graphs") is not None
    assert api.graphs(str(tmp_path / "bert"), {}) == "text2text-generation-with-past"
    assert api.graphs(str(gpt2), {}) == "text-generation-with-past"  # the next loader still answers
