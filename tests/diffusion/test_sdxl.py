"""A pipeline added as a row of the table (diffusion/known_pipelines.py): a tiny StableDiffusionXLPipeline
directory (diffusers' fast-test sizes) through the CLI with no flags. Its UNet takes SDXL's added conditioning
(``text_embeds``, ``time_ids``, Optimum's names) as graph inputs, both CLIPs give their penultimate hidden state
and the projected one its pooled embedding, the end-to-end check runs diffusers' SDXL loop on the graphs, and the
bundle's runner gives diffusers' image at a size other than the example's. A real export: marked slow."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from cann_export.cli.main import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def sdxl(tmp_path_factory):
    from diffusers import StableDiffusionXLPipeline

    from helpers.tiny_diffusion import save, sdxl_pipeline

    root = tmp_path_factory.mktemp("sdxl")
    save(sdxl_pipeline(), root / "sdxl-dir")
    pipe = StableDiffusionXLPipeline.from_pretrained(root / "sdxl-dir", local_files_only=True)
    res = CliRunner().invoke(cli, [str(root / "sdxl-dir"), "-o", str(root / "bundle")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return pipe, root / "bundle"


def test_sdxl_unet_takes_the_added_conditioning_and_the_clips_feed_it(sdxl):
    _, bundle = sdxl
    manifest = json.loads((bundle / "manifest.json").read_text())
    named = {c["name"]: (c["inputs"], c["outputs"]) for c in manifest["components"]}
    assert list(named) == ["text_encoder", "text_encoder_2", "unet", "vae_encoder", "vae_decoder"]
    assert named["unet"] == (["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"],
                             ["out_sample"])
    wires = {(c["from"]["component"], c["from"]["output"], c["to"]["component"], c["to"]["input"])
             for c in manifest["connections"]}
    assert ("text_encoder_2", "text_embeds", "unet", "text_embeds") in wires
    assert {(s, o) for s, o, d, i in wires if i == "encoder_hidden_states"} == {
        ("text_encoder", "hidden_states.4"), ("text_encoder_2", "hidden_states.4")}  # 5 layers: the penultimate
    assert manifest["pipeline"]["end_to_end"]["passed"] is True


def test_sdxl_vae_decoder_claims_no_latent_dim_for_the_image_side(sdxl):
    """The tracer named the decoded image's height (twice the latent's) ``batch_size``; the graph must not say so."""
    import onnx

    _, bundle = sdxl
    graph = onnx.load(str(bundle / "components/vae_decoder/model.onnx"), load_external_data=False)
    dims = [d.dim_param or d.dim_value for d in graph.graph.output[0].type.tensor_type.shape.dim]
    assert dims[0] == "batch_size" and dims[1] == 3
    assert not {"batch_size", "height", "width"} & set(dims[2:]), dims


def test_sdxl_bundle_validates_and_runs_back_as_diffusers_at_another_size(sdxl):
    import torch

    import cann_export

    pipe, bundle = sdxl
    assert cann_export.validate(bundle)["passed"] is True
    runner = cann_export.load(bundle)
    assert type(runner).__name__ == "StableDiffusionXLPipeline"
    call = {"prompt": "a photo of a dog", "num_inference_steps": 3, "guidance_scale": 5.0, "output_type": "np",
            "height": 48, "width": 96}
    got = runner(generator=torch.Generator().manual_seed(1), **call).images
    want = pipe(generator=torch.Generator().manual_seed(1), **call).images
    assert got.shape == want.shape == (1, 48, 96, 3)
    np.testing.assert_allclose(got, want, atol=1e-4)
