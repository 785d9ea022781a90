"""An LCM-distilled UNet (``time_cond_proj_dim``: its guidance-scale embedding) with diffusers' LCMScheduler, exported
from Python as a user holding the pipeline does: the UNet takes ``timestep_cond`` (Optimum's name) as a graph input,
which the pipeline makes on the host from the guidance scale; the end-to-end check and the runner run the pipeline's
own LCM loop. A real export: marked slow."""
import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_an_lcm_unet_takes_its_guidance_embedding_and_runs_back_as_diffusers(tmp_path):
    import torch

    import cann_export
    from helpers.tiny_diffusion import sd_pipeline

    pipe = sd_pipeline(time_cond_proj_dim=256)
    assert type(pipe.scheduler).__name__ == "LCMScheduler"
    result = cann_export.export(pipe, tmp_path / "lcm")
    assert result.ok, result.to_dict()
    manifest = json.loads((tmp_path / "lcm" / "manifest.json").read_text())
    unet = next(c for c in manifest["components"] if c["name"] == "unet")
    assert unet["inputs"] == ["sample", "timestep", "encoder_hidden_states", "timestep_cond"]
    assert manifest["pipeline"]["end_to_end"]["passed"] is True
    call = {"prompt": "a dog", "num_inference_steps": 3, "guidance_scale": 6.0, "output_type": "np"}
    got = cann_export.load(tmp_path / "lcm")(generator=torch.Generator().manual_seed(2), **call).images
    want = pipe(generator=torch.Generator().manual_seed(2), **call).images
    np.testing.assert_allclose(got, want, atol=1e-4)
