"""Hostile model directories the hf loaders refuse before transformers reads them: a hub cache whose blobs is a
link, a config.json that redirects the weight file, a peft adapter, a model.safetensors beside a shard index
(transformers loads model.safetensors: that is the file checked), an index linking out of a multi-graph source,
and config fields whose dummy inputs multiply past any real size. Each is refused naming the file (no export)."""
import json
import os
import shutil
from types import SimpleNamespace

import pytest
from helpers import hf_dirs

from cann_export.errors import LoadError
from cann_export.hf import directory_files as hf_files
from cann_export.hf.loader import HfDirectoryLoader
from cann_export.hf.weights import checked_weights

OPTIONS = SimpleNamespace(trust_remote_code=False, trust_pickle=False, task=None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny bert directory (one file) and a sharded gpt2 directory, saved once; tests copy them."""
    root = tmp_path_factory.mktemp("hostile")
    return {"bert": hf_dirs.save("bert", root / "bert"),
            "gpt2_sharded": hf_dirs.save("gpt2", root / "gpt2", max_shard_size="40KB"),
            "bert_sharded": hf_dirs.save("bert", root / "bert_sharded", max_shard_size="40KB")}


_copy = hf_dirs.copy_saved


def test_hub_cache_whose_blobs_links_to_root_is_refused(saved, tmp_path):
    """blobs -> / made every link "inside": the snapshot carried any file (here a secret) as hf/vocab.txt."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0\n")
    store = _copy(saved, "bert", tmp_path)
    repo = tmp_path / "models--evil--m"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    os.symlink("/", repo / "blobs")
    for f in [*store.iterdir(), secret]:
        name = "vocab.txt" if f == secret else f.name
        os.symlink("../../blobs" + str(f.resolve()), snapshot / name)
    with pytest.raises(LoadError, match="blobs is a link") as e:
        directory, roots = hf_files.resolve(repo)
        hf_files.companions(directory, roots)
    assert e.value.path == str(repo / "blobs")


def test_config_redirecting_the_weight_file_is_refused(saved, tmp_path):
    directory = _copy(saved, "bert", tmp_path)
    shutil.copy(directory / "model.safetensors", directory / "other.safetensors")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformers_weights": "other.safetensors"}))
    with pytest.raises(LoadError, match="transformers_weights") as e:
        HfDirectoryLoader().load(directory, OPTIONS)
    assert e.value.path.endswith("config.json")


def test_a_nested_config_is_checked_like_the_top_level(saved, tmp_path):
    """A composite config (vision-encoder-decoder: ``encoder`` / ``decoder`` objects) hides no remote code, weight
    redirect or oversized field in its nested configs; a model_type with a hyphen is a name, a path is not."""
    directory = _copy(saved, "bert", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    for nested, match in (({"decoder": {"auto_map": {"AutoModel": "evil.Model"}}}, "auto_map"),
                          ({"encoder": {"transformers_weights": "other.safetensors"}}, "transformers_weights"),
                          ({"decoder": {"vocab_size": 1 << 40}}, "decoder.vocab_size"),
                          ({"decoder": "gpt2"}, "not an object"),
                          ({"model_type": "../bert"}, "model_type"),
                          ({"decoder": {"model_type": "../gpt2"}}, "decoder.model_type"),
                          ({"encoder": {"encoder": {"image_size": 1 << 22}}}, "encoder.encoder.image_size")):
        (directory / "config.json").write_text(json.dumps({**config, **nested}))
        with pytest.raises(LoadError, match=match) as e:
            HfDirectoryLoader().load(directory, OPTIONS)
        assert e.value.path.endswith("config.json")


def test_peft_adapter_directory_is_refused(saved, tmp_path):
    directory = _copy(saved, "bert", tmp_path)
    (directory / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/elsewhere"}))
    with pytest.raises(LoadError, match="peft adapter"):
        checked_weights(directory, [directory.resolve()], False)


def test_model_safetensors_beside_an_index_is_the_file_checked(saved, tmp_path):
    """transformers loads model.safetensors before the index: a truncated one is refused though the shards
    the index lists are sound."""
    directory = _copy(saved, "bert_sharded", tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[0]
    (directory / "model.safetensors").write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(LoadError, match="truncated"):
        checked_weights(directory, [directory.resolve()], False)


def test_multi_graph_source_refuses_an_index_linking_out(saved, tmp_path):
    from cann_export.hf.directory_source import load_directory

    directory = _copy(saved, "gpt2_sharded", tmp_path)
    model, task, carried = load_directory(directory, "text-generation-with-past", {})  # sound: loads
    assert task == "text-generation-with-past" and "hf/config.json" in carried
    outside = tmp_path / "index.json"
    (directory / "model.safetensors.index.json").rename(outside)
    os.symlink(outside, directory / "model.safetensors.index.json")
    with pytest.raises(LoadError, match="links outside the model directory"):
        load_directory(directory, "text-generation-with-past", {})


def test_dummy_inputs_past_the_element_cap_are_refused():
    from cann_export.hf.dummy_inputs import dummy_specs

    with pytest.raises(LoadError, match="image_size and num_channels") as e:
        dummy_specs(["pixel_values"], {"image_size": 16384, "num_channels": 1024}, "image-classification")
    assert e.value.path == "config.json"
    with pytest.raises(LoadError, match="num_mel_bins and max_source_positions"):
        dummy_specs(["input_features"], {"num_mel_bins": 4096, "max_source_positions": 1 << 20}, "feature-extraction")
    assert dummy_specs(["pixel_values"], {"image_size": 224, "num_channels": 3}, "image-classification")


def test_patch_size_is_bounded_like_the_other_fields(saved, tmp_path):
    from cann_export.hf.config_json import read_config

    directory = _copy(saved, "bert", tmp_path)
    for bad in (1 << 20, [16, -1], "16"):
        config = json.loads((saved["bert"] / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "patch_size": bad}))
        with pytest.raises(LoadError, match="patch_size"):
            read_config(directory, False)


def test_pickled_weights_follow_transformers_order_too(tmp_path):
    """With no safetensors, transformers loads pytorch_model.bin before its index: that is the file named."""
    import torch

    from cann_export.hf.weights import weight_files

    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "missing-1.bin"}}))
    assert weight_files(tmp_path, True) == (False, [tmp_path / "pytorch_model.bin"])
