"""A diffusers pipeline directory is untrusted input: what is not a pipeline this tool exports is refused before
any load, with one paragraph naming the file and the fix, exit 2, nothing written."""
import json
import subprocess
import sys

from click.testing import CliRunner

from cann_export.cli.main import cli

SD3_INDEX = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_3": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
             "tokenizer_2": ["transformers", "CLIPTokenizer"], "tokenizer_3": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
             "image_encoder": [None, None], "feature_extractor": [None, None]}


def _directory(root, index=None, drop=()):
    """A pipeline directory's layout (empty weights suffice: the checks run before any load)."""
    root.mkdir()
    index = dict(SD3_INDEX if index is None else index)
    (root / "model_index.json").write_text(json.dumps(index))
    for part, entry in index.items():
        if part.startswith("_") or entry[0] is None or part in drop:
            continue
        (root / part).mkdir()
        if part.startswith("tokenizer"):
            (root / part / "tokenizer.json").write_text("{}")
        elif part == "scheduler":
            (root / part / "scheduler_config.json").write_text("{}")
        else:
            (root / part / "config.json").write_text("{}")
            (root / part / "model.safetensors").write_bytes(b"")
    return root


def _refused(tmp_path, source, *words):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [str(source), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for word in words:
        assert word in res.output, res.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "cann-tmp" in p.name]
    return res.output


def test_a_class_outside_diffusers_and_transformers_is_refused_naming_model_index(tmp_path):
    index = {**SD3_INDEX, "transformer": ["my_package", "EvilTransformer"]}
    text = _refused(tmp_path, _directory(tmp_path / "pipe", index), "model_index.json", "my_package.EvilTransformer",
                    "no remote code")
    assert "transformer" in text


def test_an_unknown_pipeline_class_is_refused_naming_what_exports(tmp_path):
    index = {**SD3_INDEX, "_class_name": "FluxPipeline"}
    _refused(tmp_path, _directory(tmp_path / "pipe", index), "FluxPipeline", "StableDiffusion3Pipeline",
             "model_index.json")


def test_a_missing_tokenizer_is_refused_naming_its_folder_and_the_fix(tmp_path):
    _refused(tmp_path, _directory(tmp_path / "pipe", drop=("tokenizer_2",)), "tokenizer_2", "text_encoder_2",
             "save_pretrained")


def test_an_sd3_saved_without_its_t5_is_refused_saying_why_not_to_save_the_whole_pipeline(tmp_path):
    """diffusers' docs suggest dropping SD3's T5 (text_encoder_3=None) to save memory; such a pipeline saves
    ``text_encoder_3: [null, null]``. The refusal names that entry and what to do, not a folder gone missing."""
    index = {**SD3_INDEX, "text_encoder_3": [None, None], "tokenizer_3": [None, None]}
    text = _refused(tmp_path, _directory(tmp_path / "pipe", index), "model_index.json sets text_encoder_3 to null",
                    "text_encoder_3=None", "snapshot")
    assert "has no text_encoder_3/ folder" not in text


def test_pickled_weights_are_refused(tmp_path):
    root = _directory(tmp_path / "pipe")
    (root / "vae" / "model.safetensors").unlink()
    (root / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"\x80\x04")
    _refused(tmp_path, root, "vae", ".safetensors")


def test_a_model_index_that_is_not_json_is_refused(tmp_path):
    root = _directory(tmp_path / "pipe")
    (root / "model_index.json").write_text("{not json")
    _refused(tmp_path, root, "model_index.json", "not valid JSON")


def test_without_diffusers_a_pipeline_directory_is_refused_naming_the_extra(tmp_path):
    from cann_export.diffusion.directory import diffusers_module

    code = ("import sys; sys.modules['diffusers'] = None\n"
            "from cann_export.diffusion.directory import diffusers_module\n"
            "from cann_export.errors import LoadError\n"
            "try:\n    diffusers_module()\nexcept LoadError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'cann-export[diffusers]'" in out
    assert diffusers_module() is not None  # installed here: no refusal


def test_a_one_graph_output_name_is_refused_naming_the_bundle_forms(tmp_path):
    root = _directory(tmp_path / "pipe")
    res = CliRunner().invoke(cli, [str(root), "-o", str(tmp_path / "out.onnx")])
    assert res.exit_code == 2 and ".pth" in res.output and "out.onnx" in res.output, res.output
    assert not (tmp_path / "out.onnx").exists()


def test_a_side_the_vae_cannot_take_is_refused_naming_the_flag_and_the_multiple(tmp_path):
    """The tiny UNet pipeline's VAE halves the image once (scale factor 2): an image side of 33 pixels has no
    latent, so --dynamic image_height=33..128 is refused before any graph is captured."""
    from helpers.tiny_diffusion import save, sd_pipeline

    directory = save(sd_pipeline(), tmp_path / "sd-dir")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [str(directory), "-o", str(out), "--dynamic", "image_height=33..128"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for word in ("--dynamic image_height=33..128", "multiples of 2", "33"):
        assert word in res.output, res.output
    assert not out.exists()
