"""Hostile model directories found by a second probe: weights that do not cover the model (renamed tensors, a
shard the index leaves out: transformers would fill them at random and only warn), shards that disagree with their
index, crafted safetensors headers, a hub-cache snapshot that is itself a link out, layer counts under other names
than num_hidden_layers (built on the meta device before the size check could refuse), non-strict JSON carried into
the bundle, and a static KV cache past the position table. Each refused before any export, naming the file."""
import json
import os
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import hf_dirs

from cann_export.errors import LoadError, OptionsError
from cann_export.hf import directory_files as hf_files
from cann_export.hf.loader import HfDirectoryLoader
from cann_export.hf.weights import checked_weights

OPTIONS = SimpleNamespace(trust_remote_code=False, trust_pickle=False, task=None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile2")
    return {"bert": hf_dirs.save("bert", root / "bert"),
            "bert_sharded": hf_dirs.save("bert", root / "bert_sharded", max_shard_size="40KB"),
            "gpt2": hf_dirs.save("gpt2", root / "gpt2")}


_copy = hf_dirs.copy_saved


def _rewrite_header(path, edit):
    """``path``'s safetensors header edited by ``edit`` (the data bytes unchanged, the header re-padded)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


def _first_tensor(header):
    return next(k for k in sorted(header) if k != "__metadata__")


def test_renamed_tensors_are_refused_not_filled_at_random(saved, tmp_path):
    directory = _copy(saved, "bert", tmp_path)
    _rewrite_header(directory / "model.safetensors",
                    lambda h: h.update({("junk." + k if k != "__metadata__" else k): h.pop(k) for k in list(h)}))
    with pytest.raises(LoadError, match=r"weight\(s\) of BertForSequenceClassification are not in the") as e:
        HfDirectoryLoader().load(directory, OPTIONS)
    assert e.value.path == str(directory)


def test_an_index_that_leaves_a_shard_out_is_refused(saved, tmp_path):
    directory = _copy(saved, "bert_sharded", tmp_path)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != last}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / last).unlink()
    with pytest.raises(LoadError, match="are not in the directory's weight files"):
        HfDirectoryLoader().load(directory, OPTIONS)


def test_a_tensor_in_a_shard_the_index_does_not_name_is_refused(saved, tmp_path):
    directory = _copy(saved, "bert_sharded", tmp_path)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))[:2]
    moved = next(k for k, v in index["weight_map"].items() if v == first)
    index["weight_map"][moved] = second  # the index now says the other shard holds it
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LoadError, match="the shards do not match model.safetensors.index.json") as e:
        checked_weights(directory, [directory.resolve()], False)
    assert e.value.path == str(directory / "model.safetensors.index.json")


@pytest.mark.parametrize("edit, words", [
    (lambda h: h[_first_tensor(h)].update(dtype="X99"), 'has dtype "X99"'),
    (lambda h: h[_first_tensor(h)].update(shape=[1.5]), "no shape of non-negative sizes"),
    (lambda h: h[_first_tensor(h)].update(data_offsets=[8, 4]), "no valid data_offsets"),
    (lambda h: h[_first_tensor(h)].update(data_offsets=[True, 4]), "no valid data_offsets"),
    (lambda h: h[_first_tensor(h)].update(shape=[1, 1]), "not the 4 its shape and dtype need"),
    (lambda h: h.update(__metadata__={"format": ["pt"]}), "__metadata__ is not a map of strings"),
    (lambda h: h[_first_tensor(h)].update(dtype="F4"), "packed dtype F4 of a quantized checkpoint"),
    (lambda h: [e.update(data_offsets=[0, e["data_offsets"][1] - e["data_offsets"][0]])
                for k, e in h.items() if k != "__metadata__"], "an overlap or a gap"),
])
def test_a_crafted_safetensors_header_is_refused_naming_the_file(saved, tmp_path, edit, words):
    directory = _copy(saved, "bert", tmp_path)
    _rewrite_header(directory / "model.safetensors", edit)
    with pytest.raises(LoadError, match="model.safetensors") as e:
        checked_weights(directory, [directory.resolve()], False)
    assert words in e.value.message and e.value.path == str(directory / "model.safetensors")


@pytest.mark.parametrize("value", [[["model-00001-of-00002.safetensors"]], [{"file": "x.safetensors"}]])
def test_an_index_mapping_to_a_non_name_is_refused(saved, tmp_path, value):
    directory = _copy(saved, "bert_sharded", tmp_path)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = value[0]
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LoadError, match="not a shard file name"):
        checked_weights(directory, [directory.resolve()], False)


def test_a_shard_linking_out_is_refused_before_it_is_read(saved, tmp_path):
    directory = _copy(saved, "bert_sharded", tmp_path)
    shard = sorted(directory.glob("*.safetensors"))[-1]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\xff" * 64)  # not safetensors: reading it would say so
    shard.unlink()
    os.symlink(outside, shard)
    with pytest.raises(LoadError, match="links outside the model directory"):
        checked_weights(directory, [directory.resolve()], False)


def test_a_hub_cache_snapshot_that_is_a_link_out_is_refused(saved, tmp_path):
    repo = tmp_path / "models--evil--m"
    (repo / "snapshots").mkdir(parents=True)
    elsewhere = _copy(saved, "bert", tmp_path)
    (elsewhere / "vocab.txt").write_text("SECRET\n")
    os.symlink(elsewhere, repo / "snapshots" / ("0" * 40))
    for path in (repo, repo / "snapshots" / ("0" * 40)):
        with pytest.raises(LoadError, match="is a link"):
            hf_files.resolve(path)


@pytest.mark.parametrize("name, edit, words", [
    ("gpt2", {"n_layer": 20000}, "n_layer is 20000"),
    ("bert", {"num_hidden_layers": 5000}, "num_hidden_layers is 5000"),
    ("bert", {"layer_norm_eps": float("nan")}, "not RFC 8259 JSON: NaN"),
    ("bert", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     'quantization_config ("bitsandbytes") makes this a quantized checkpoint'),
    ("bert", {"attn_implementation": "kernels-community/flash-attn"}, "a kernel from the Hugging Face Hub"),
    ("bert", {"attn_implementation": {"": "org/kernel"}}, "a kernel from the Hugging Face Hub"),
])
def test_config_fields_are_checked_under_every_name(saved, tmp_path, name, edit, words):
    directory = _copy(saved, name, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(LoadError, match="config.json") as e:
        HfDirectoryLoader().load(directory, OPTIONS)
    assert words in e.value.message


@pytest.mark.parametrize("text, words", [
    ('{"max_length": NaN}', "not RFC 8259 JSON: NaN"),
    ('{"a": 1, "a": 2}', "appears twice"),
    ("[" * 100000 + "]" * 100000, "nests too deeply"),
])
def test_a_companion_file_carried_into_the_bundle_must_be_strict_json(saved, tmp_path, text, words):
    directory = _copy(saved, "bert", tmp_path)
    (directory / "generation_config.json").write_text(text)
    with pytest.raises(LoadError, match="generation_config.json is not strict JSON") as e:
        hf_files.companions(*hf_files.resolve(directory))
    assert words in e.value.message


def test_a_static_cache_past_the_position_table_is_refused(tmp_path):
    from helpers.hf_models import tiny_decoder_gpt2

    from cann_export import api

    with pytest.raises(OptionsError, match="position table holds 16 positions"):
        api.export_multi(tiny_decoder_gpt2(n_positions=16), tmp_path / "x", kv_cache="static:64")
    with pytest.raises(OptionsError, match="more than the model's weights or 1 GiB"):
        api.export_multi(tiny_decoder_gpt2(n_positions=4096), tmp_path / "x", kv_cache="static:4096,batch=2048")
    assert not (tmp_path / "x").exists()


def test_sigterm_unwinds_the_export_and_leaves_nothing(saved, tmp_path):
    """A CI job's timeout sends SIGTERM: the export stops like Ctrl-C (exit 143), its staging removed."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root)])}
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cann_export", str(saved["bert"]), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:  # the load has started: a staging directory exists from here on
        lines.append(line)
        if "[1/12] load" in line:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, "".join(lines) + rest
    assert "terminated" in rest and "Traceback" not in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_link_loop_is_refused_naming_the_file(saved, tmp_path, name):
    directory = _copy(saved, "bert", tmp_path)
    (directory / name).unlink()
    os.symlink(directory / "loop_b", directory / "loop_a")
    os.symlink(directory / "loop_a", directory / "loop_b")
    os.symlink(directory / "loop_a", directory / name)
    with pytest.raises(LoadError, match="is a link that leads nowhere") as e:
        directory_, roots = hf_files.resolve(directory)
        checked_weights(directory_, roots, False)
    assert e.value.path == str(directory / name)


def test_feature_extraction_of_a_head_checkpoint_loads_without_its_untrained_pooler(tmp_path):
    """RoBERTa's fill-mask and ViT's classifier checkpoints have no pooler weights: feature-extraction exports
    last_hidden_state only, so the missing pooler is not a refusal (a missing weight anywhere else is)."""
    import transformers

    import cann_export

    cfg = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64)
    transformers.RobertaForMaskedLM(cfg).save_pretrained(tmp_path / "roberta")
    result = cann_export.export(str(tmp_path / "roberta"), tmp_path / "r.onnx", export_format="onnx",
                                task="feature-extraction", sandbox="off")
    assert result.ok and result.manifest["model"]["outputs"][0]["name"] == "last_hidden_state"


def test_safetensors_dtypes_beyond_the_float_ones_are_read(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, dtype=torch.float8_e8m0fnu), "b": torch.zeros(2, dtype=torch.complex64),
               "c": torch.zeros(0)}, str(tmp_path / "model.safetensors"))
    assert checked_weights(tmp_path, [tmp_path.resolve()], False)[1] == [tmp_path / "model.safetensors"]


def test_a_user_folder_called_snapshots_may_hold_a_link(saved, tmp_path):
    (tmp_path / "runs" / "snapshots").mkdir(parents=True)
    target = _copy(saved, "bert", tmp_path / "runs")
    os.symlink(target, tmp_path / "runs" / "snapshots" / "latest")
    directory, roots = hf_files.resolve(tmp_path / "runs" / "snapshots" / "latest")
    assert roots == [target.resolve()]


def test_a_classifier_checkpoint_without_its_pooler_is_refused(saved, tmp_path):
    """BERT's sequence classifier reads the pooler: missing pooler weights are a refusal for that task."""
    from safetensors.torch import load_file, save_file

    directory = _copy(saved, "bert", tmp_path)
    weights = {k: v for k, v in load_file(str(directory / "model.safetensors")).items() if ".pooler." not in k}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LoadError, match="pooler"):
        HfDirectoryLoader().load(directory, OPTIONS)


def test_a_hub_snapshot_named_relatively_reads_its_blobs(saved, tmp_path, monkeypatch):
    store = _copy(saved, "bert", tmp_path)
    repo = tmp_path / "models--org--m"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in store.iterdir():
        shutil.copy(f, repo / "blobs" / f.name)
        os.symlink(f"../../blobs/{f.name}", repo / "snapshots" / commit / f.name)
    monkeypatch.chdir(repo)
    directory, roots = hf_files.resolve(Path("snapshots") / commit)
    assert (repo / "blobs").resolve() in roots
    assert checked_weights(directory, roots, False)[0] is True


def test_a_static_cache_into_one_file_needs_no_task():
    """--kv-cache asks for the graphs itself: the defaulted-task guard for one-file outputs does not apply."""
    from cann_export import api

    api._check_defaulted("gpt2-dir", "text-generation-with-past", "gpt2.zip", "atc_ready", {"kv_cache": "static:16"})


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt", "generation_config.json"])
@pytest.mark.parametrize("how", ["dangling", "loop"])
def test_a_carried_file_that_dangles_or_loops_is_refused_not_skipped(saved, tmp_path, name, how):
    """Issue 41: a carried tokenizer.json that led nowhere was silently left out of the bundle."""
    directory = _copy(saved, "bert", tmp_path)
    (directory / name).unlink(missing_ok=True)
    if how == "dangling":
        os.symlink(directory / "gone.json", directory / name)
    else:
        os.symlink(directory / "loop_b", directory / "loop_a")
        os.symlink(directory / "loop_a", directory / "loop_b")
        os.symlink(directory / "loop_a", directory / name)
    with pytest.raises(LoadError, match="is a link that leads nowhere") as e:
        hf_files.companions(*hf_files.resolve(directory))
    assert e.value.path == str(directory / name) and name in e.value.message


@pytest.mark.parametrize("number", ["1e999", "-1E400", "2e308"])
def test_a_number_past_the_float_range_is_refused_like_infinity(saved, tmp_path, number):
    """Issue 41: config.json's 1e999 read as inf where the Infinity literal was refused."""
    directory = _copy(saved, "bert", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 0.123}).replace("0.123", number))
    with pytest.raises(LoadError, match="config.json") as e:
        HfDirectoryLoader().load(directory, OPTIONS)
    assert f"the number {number} is past the float range" in e.value.message
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer_config.json").write_text(f'{{"model_max_length": {number}}}')
    with pytest.raises(LoadError, match="tokenizer_config.json is not strict JSON"):
        hf_files.companions(*hf_files.resolve(directory))
