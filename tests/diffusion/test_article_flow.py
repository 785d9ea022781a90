"""The article's flow (seeds/000_014a2e712e2a61aa.txt) on npu-sim with a tiny SD3 pipeline: ``.to("cann")``,
AdamW over ``pipeline.parameters()`` (which diffusers lacks: given under cann.torch.enable(), with the one-line
fix named), a training step, ``cann.torch.export(model=pipe, output_path="sd3_brand_v1.pth", ...)`` with the
article's hints (warnings naming what SD3 has instead, and that ATC has no nhwc_optimized), then the zoo: publish,
and ``load_model(framework="pytorch")`` with the backend still enabled (the article's order), which generates the
exported image on npu-sim."""
import json
import zipfile

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def enabled():
    import cann.torch

    cann.torch.enable("npu-sim")
    yield
    cann.torch.disable()


def test_pipeline_parameters_is_diffusers_dict_without_enable_and_callable_with_it():
    import cann.torch
    from helpers.tiny_diffusion import sd_pipeline

    pipe = sd_pipeline()
    with pytest.raises(TypeError):
        pipe.parameters()  # diffusers' property: a dict of init arguments
    cann.torch.enable("npu-sim")
    try:
        assert dict(pipe.parameters) == {"requires_safety_checker": False}
        with pytest.warns(UserWarning, match=r"pipe\.unet\.parameters\(\)"):
            assert len(list(pipe.parameters())) == sum(1 for part in (pipe.text_encoder, pipe.unet, pipe.vae)
                                                       for _ in part.parameters())
    finally:
        cann.torch.disable()
    with pytest.raises(TypeError):
        pipe.parameters()


def test_article_flow_on_npu_sim_trains_exports_with_hints_and_publishes(enabled, tmp_path):
    import torch

    import cann.model_zoo
    import cann.torch
    from helpers.tiny_diffusion import sd3_pipeline

    pipe = sd3_pipeline()
    pipe.to("cann")
    assert {p.device.type for p in pipe.transformer.parameters()} == {"npu"}
    assert {p.device.type for p in pipe.vae.parameters()} == {"npu"}
    with pytest.warns(UserWarning, match=r"pipe\.transformer\.parameters\(\)"):
        params = list(pipe.parameters())
    assert len(params) == sum(len(list(getattr(pipe, n).parameters())) for n in
                              ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"))
    optimizer = torch.optim.AdamW(pipe.transformer.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, 32, 32, generator=gen).to("cann")
    before = pipe.transformer.proj_out.weight.detach().cpu().clone()
    out = pipe.transformer(hidden_states=latents, encoder_hidden_states=torch.randn(1, 8, 32).to("cann"),
                           pooled_projections=torch.randn(1, 64).to("cann"),
                           timestep=torch.tensor([500.0]).to("cann"), return_dict=False)[0]
    loss = torch.nn.functional.mse_loss(out, torch.zeros_like(out))
    loss.backward()
    optimizer.step()
    assert not torch.equal(before, pipe.transformer.proj_out.weight.detach().cpu())

    with pytest.warns(UserWarning) as said:
        result = cann.torch.export(model=pipe, output_path=tmp_path / "sd3_brand_v1.pth", export_format="atc_ready",
                                   metadata={"brand": "v1"},
                                   atc_hints={"insert_teacache": ["unet.mid_block"], "memory_layout": "nhwc_optimized"})
    texts = " ".join(str(w.message) for w in said)
    assert "unet.mid_block" in texts and "transformer.transformer_blocks.0..0" in texts
    assert "nhwc_optimized" in texts and "NCHW" in texts
    assert result.ok, result.to_dict()
    assert {p.device.type for p in pipe.transformer.parameters()} == {"npu"}  # left where it was
    with zipfile.ZipFile(tmp_path / "sd3_brand_v1.pth") as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert len(manifest["pipeline"]["warnings"]) == 2
    assert manifest["pipeline"]["end_to_end"]["passed"] is True
    import numpy as np

    import cann_export

    runner = cann_export.load(tmp_path / "sd3_brand_v1.pth")  # the one file, run back in onnxruntime
    call = {"prompt": "a photo of a cat", "num_inference_steps": 2, "guidance_scale": 5.0, "output_type": "np"}
    got = runner(generator=torch.Generator().manual_seed(0), **call).images
    pipe.to("cpu")
    want = pipe(generator=torch.Generator().manual_seed(0), **call).images
    np.testing.assert_allclose(got, want, atol=1e-3)
    record = cann.model_zoo.publish(model=str(tmp_path / "sd3_brand_v1.pth"), name="sd3-brand",
                                    zoo=str(tmp_path / "zoo"))
    assert record["version"] and cann.model_zoo.verify("sd3-brand", zoo=str(tmp_path / "zoo"))
    assert record["kinds"] == ["pytorch", "atc_ready"]  # the .pth carries the safetensors load_model rebuilds from

    # the article's order: still enabled, load the published pipeline back and generate on the device
    loaded = cann.model_zoo.load_model("sd3-brand", framework="pytorch", zoo=str(tmp_path / "zoo"))
    assert type(loaded).__name__ == "StableDiffusion3Pipeline"
    loaded.to("cann")
    assert {p.device.type for p in loaded.transformer.parameters()} == {"npu"}
    np.testing.assert_allclose(loaded(generator=torch.Generator().manual_seed(0), **call).images, got, atol=1e-3)

