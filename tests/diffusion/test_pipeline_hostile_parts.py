"""A pipeline directory's parts are loaded under the rules of a single model's directory: a config that does not
belong to its weights (weights left random, or one integer that allocates gigabytes), an unbounded config, a config
value the loop cannot compute with, a CLIP tokenizer without its config, and a model_index.json of odd JSON are each
refused naming the file: exit 2, no traceback, nothing written (a bundle's carried files: test_run_back.py)."""
import json
import shutil

import pytest
from click.testing import CliRunner

from cann_export.cli.main import cli


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from helpers.tiny_diffusion import save, sd3_pipeline

    return save(sd3_pipeline(), tmp_path_factory.mktemp("sd3") / "pipe")


def _edited(sd3_dir, tmp_path, rel, edit):
    copy = tmp_path / "pipe"
    shutil.copytree(sd3_dir, copy)
    path = copy / rel
    if edit is None:
        path.unlink()
    else:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    return copy


def _refused(tmp_path, source, *words):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [str(source), "-o", str(out), "--no-validate"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "[internal]" not in res.output, res.output
    for word in words:
        assert word in res.output, res.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]
    return res.output


def test_a_config_describing_layers_the_weights_lack_is_refused_not_filled_at_random(sd3_dir, tmp_path):
    def one_more_layer(config):
        config["num_hidden_layers"] += 1

    source = _edited(sd3_dir, tmp_path, "text_encoder/config.json", one_more_layer)
    _refused(tmp_path, source, "text_encoder", "not in text_encoder/'s weight files", "random values")


def test_a_config_integer_that_would_allocate_far_past_the_weights_is_refused_before_the_load(sd3_dir, tmp_path):
    def huge_table(config):
        config["pos_embed_max_size"] = 1500  # a [1, 1500 * 1500, width] position table

    source = _edited(sd3_dir, tmp_path, "transformer/config.json", huge_table)
    _refused(tmp_path, source, "transformer/config.json", "describes a SD3Transformer2DModel", "weight files hold")


@pytest.mark.parametrize("rel,key,value", [("vae/config.json", "scaling_factor", "abc"),
                                           ("scheduler/scheduler_config.json", "num_train_timesteps", 2e7)])
def test_a_config_value_the_loop_computes_with_must_be_a_number_in_range(sd3_dir, tmp_path, rel, key, value):
    source = _edited(sd3_dir, tmp_path, rel, lambda config: config.update({key: value}))
    _refused(tmp_path, source, rel, key)


def test_a_config_past_its_bound_is_refused_unread(sd3_dir, tmp_path):
    source = _edited(sd3_dir, tmp_path, "text_encoder/config.json", lambda c: c.update(junk="x" * (2 << 20)))
    _refused(tmp_path, source, "text_encoder/config.json", "larger than 1 MiB")


def test_a_clip_tokenizer_without_its_config_is_refused_naming_the_folder(sd3_dir, tmp_path):
    source = _edited(sd3_dir, tmp_path, "tokenizer/tokenizer_config.json", None)
    _refused(tmp_path, source, "tokenizer/", "model_max_length", "tokenizer_config.json")


def test_a_config_the_pipeline_cannot_run_is_refused_as_the_directorys_fault(sd3_dir, tmp_path):
    source = _edited(sd3_dir, tmp_path, "transformer/config.json", lambda c: c.update(sample_size=-8))
    _refused(tmp_path, source, "negative dimension", "re-save the pipeline")


@pytest.mark.parametrize("edit,words", [
    (lambda i: i.update(_class_name=["diffusers", "StableDiffusion3Pipeline"]), ("pipeline class",)),
    (lambda i: i.update(vae=[["diffusers"], "AutoencoderKL"]), ("part 'vae'",)),
    (lambda i: i.update(vae=["diffusers", {"a": 1}]), ("part 'vae'",)),
    (lambda i: i.update({"../vae": ["diffusers", "AutoencoderKL"]}), ("'../vae'", "folder name")),
])
def test_model_index_values_of_the_wrong_json_type_are_refused(sd3_dir, tmp_path, edit, words):
    _refused(tmp_path, _edited(sd3_dir, tmp_path, "model_index.json", edit), "model_index.json", *words)


def test_a_deeply_nested_model_index_is_refused(sd3_dir, tmp_path):
    source = tmp_path / "pipe"
    shutil.copytree(sd3_dir, source)
    (source / "model_index.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(tmp_path, source, "model_index.json", "nests too deeply")


def test_a_part_that_is_not_the_pipelines_module_is_refused_by_the_api(tmp_path):
    import torch

    import cann_export
    from cann_export.errors import ExportError
    from helpers.tiny_diffusion import sd3_pipeline

    pipe = sd3_pipeline()
    pipe.vae = torch.nn.Linear(2, 2)
    with pytest.raises(ExportError, match="each part must be"):
        cann_export.export(pipe, tmp_path / "out", validate=False)
    assert not (tmp_path / "out").exists()


def test_trust_remote_code_is_said_to_be_ignored_for_a_pipeline_directory(sd3_dir, tmp_path):
    import cann_export

    with pytest.warns(UserWarning, match="trust_remote_code is ignored for a diffusers pipeline"):
        result = cann_export.export(str(sd3_dir), tmp_path / "out", trust_remote_code=True, validate=False)
    assert result.ok


@pytest.mark.parametrize("rel,edit,words", [
    ("transformer/config.json", lambda c: c.update(num_layers=1 << 20), ("num_layers", "past the")),
    ("text_encoder_2/config.json", lambda c: c.update(transformers_weights="../x.safetensors"),
     ("transformers_weights", "another weight file")),
])
def test_a_part_config_past_the_model_directory_rules_is_refused_before_any_build(sd3_dir, tmp_path, rel, edit, words):
    _refused(tmp_path, _edited(sd3_dir, tmp_path, rel, edit), *words)


def test_a_full_hub_download_with_a_dpm_solver_scheduler_exports_and_runs_back(tmp_path):
    """What `huggingface-cli download` leaves beside the safetensors (pickled, Flax and ONNX weights the load
    never opens) is not read; diffusers' DPMSolverMultistepScheduler writes ``lambda_min_clipped: -Infinity`` in
    its config, which the pipeline's own reader takes (NaN is still refused)."""
    import os

    import cann_export
    from diffusers import DPMSolverMultistepScheduler
    from helpers.tiny_diffusion import save, sd_pipeline

    pipe = sd_pipeline()
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    source = save(pipe, tmp_path / "pipe")
    assert "-Infinity" in (source / "scheduler" / "scheduler_config.json").read_text()
    for rel in ("unet/diffusion_pytorch_model.bin", "unet/diffusion_flax_model.msgpack",
                "text_encoder/pytorch_model.bin", "unet/model.onnx_data"):
        with open(source / rel, "wb") as f:
            os.ftruncate(f.fileno(), 100 << 20)  # sparse: 100 MiB past every bound, nothing on disk
    res = CliRunner().invoke(cli, [str(source), "-o", str(tmp_path / "out"), "--no-validate"])
    assert res.exit_code == 0, res.output
    runner = cann_export.load(tmp_path / "out")
    assert type(runner.scheduler).__name__ == "DPMSolverMultistepScheduler"
    assert runner.scheduler.config.lambda_min_clipped == float("-inf")
