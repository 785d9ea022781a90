"""A pipeline bundle run back and kept in the zoo (issue 43 items 2, 6, 8): the bundle carries the source
pipeline's safetensors and the end-to-end check's three images; it publishes as one signed entry whose
``load_model(framework="onnx")`` is the bundle's runner (the image of ``cann_export.load``) and whose
``load_model(framework="pytorch")`` is the diffusers pipeline, which ``.to("cann")`` on npu-sim generates the
runner's image for the same seed; report.html shows the per-component verdicts, the end-to-end numbers and the
images side by side, rendered in headless Chromium with no console errors. A real export: slow."""
from __future__ import annotations

import base64
import json
import re
import shutil

import numpy as np
import pytest
import torch

import cann_export

pytestmark = pytest.mark.slow

CALL = {"prompt": "a cat", "num_inference_steps": 2, "guidance_scale": 5.0}
PARTS = ("text_encoder", "unet", "vae")


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _generate(pipe, output_type="np", seed=3):
    return pipe(generator=torch.Generator().manual_seed(seed), output_type=output_type, **CALL).images


def test_the_bundle_carries_the_source_weights_and_the_check_images(sd):
    from PIL import Image

    _, root = sd
    bundle = root / "sd_bundle"
    section = _manifest(bundle)["pipeline"]
    for part in PARTS:
        weights = [r for r in section["parts"][part] if r.endswith(".safetensors")]
        assert weights, (part, section["parts"][part])
    images = section["end_to_end"]["images"]
    assert sorted(images) == ["device", "eager", "fp32"]
    for rel in images.values():
        with Image.open(bundle / rel) as picture:
            assert picture.format == "PNG" and picture.size == (64, 64)
    assert cann_export.validate(bundle)["passed"] is True


def test_a_pickle_beside_the_weights_is_refused(sd, tmp_path):
    from cann_export.errors import ValidateError
    from cann_export.fs import digests

    _, root = sd
    bundle = tmp_path / "b"
    shutil.copytree(root / "sd_bundle", bundle)
    rel = "pipeline/unet/diffusion_pytorch_model.bin"
    (bundle / rel).write_bytes(b"\x80\x04pickle")
    manifest = _manifest(bundle)
    manifest["files"][rel] = {"sha256": digests.sha256_file(bundle / rel), "size": 9}
    manifest["pipeline"]["parts"]["unet"].append(rel)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValidateError, match="diffusion_pytorch_model.bin.*not a pipeline file"):
        cann_export.load(bundle)


def test_a_bundles_carried_scheduler_config_edited_with_its_digest_is_refused_by_load(sd, tmp_path):
    from cann_export.errors import ExportError
    from cann_export.fs import digests

    _, root = sd
    bundle = tmp_path / "b"
    shutil.copytree(root / "sd_bundle", bundle)
    rel = "pipeline/scheduler/scheduler_config.json"
    config = json.loads((bundle / rel).read_text())
    config["beta_schedule"] = "no-such-schedule"
    (bundle / rel).write_text(json.dumps(config))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][rel] = {"sha256": digests.sha256_file(bundle / rel), "size": (bundle / rel).stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="scheduler_config.json cannot be rebuilt.*re-export the bundle"):
        cann_export.load(bundle)


def test_the_zoo_keeps_a_pipeline_as_one_signed_entry_and_gives_it_back_both_ways(sd, tmp_path):
    import cann.torch
    from cann.model_zoo import load_model, publish, verify
    from cann_export.model_zoo.signing import keygen

    _, root = sd
    zoo = str(tmp_path / "zoo")
    keys = keygen(tmp_path / "k")
    record = publish(model=str(root / "sd_bundle"), name="sd-tiny", zoo=zoo, sign=keys["private_key"])
    assert record["signed"] and record["kinds"] == ["pytorch", "atc_ready"]
    assert verify("sd-tiny", zoo=zoo, key=keys["public_key"])["ok"] is True

    runner = load_model("sd-tiny", framework="onnx", zoo=zoo, verify_signature=keys["public_key"])
    exported = _generate(runner)
    np.testing.assert_array_equal(exported, _generate(cann_export.load(root / "sd_bundle")))
    exported_latents = _generate(runner, "latent")

    pipe = load_model("sd-tiny", framework="pytorch", zoo=zoo, verify_signature=keys["public_key"])
    assert type(pipe).__name__ == "StableDiffusionPipeline"
    cann.torch.enable("npu-sim")
    try:
        pipe.to("cann")
        assert {p.device.type for p in pipe.unet.parameters()} == {"npu"}
        latents = _generate(pipe, "latent").cpu().numpy()
        image = _generate(pipe)
    finally:
        cann.torch.disable()
    np.testing.assert_allclose(latents, exported_latents, atol=1e-4, rtol=1e-2)  # the e2e check's fp32 bar
    np.testing.assert_allclose(image, exported, atol=1e-3)


def test_a_changed_weight_in_the_zoo_is_refused(sd, tmp_path):
    from cann.model_zoo import load_model, publish
    from cann_export.model_zoo.zoo_errors import ZooError

    _, root = sd
    zoo = tmp_path / "zoo"
    publish(model=str(root / "sd_bundle"), name="sd-tiny", zoo=str(zoo))
    stored = [p for p in zoo.rglob("*") if p.is_file() and p.stat().st_size == (
        root / "sd_bundle/pipeline/unet/diffusion_pytorch_model.safetensors").stat().st_size]
    assert stored
    for p in stored:
        p.chmod(0o644)
        data = bytearray(p.read_bytes())
        data[-1] ^= 1
        p.write_bytes(bytes(data))
    with pytest.raises(ZooError, match="diffusion_pytorch_model.safetensors"):
        load_model("sd-tiny", framework="pytorch", zoo=str(zoo))


def test_the_report_shows_the_end_to_end_images_side_by_side_in_chromium(sd, tmp_path):
    from cann_export.report.write_report import regenerate
    from helpers.browser import chrome

    _, root = sd
    bundle = root / "sd_bundle"
    result = regenerate(bundle, tmp_path / "sd.html")
    page = (tmp_path / "sd.html").read_text()
    e2e = _manifest(bundle)["pipeline"]["end_to_end"]
    uris = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(uris) == 3 and result["passed"] is True
    assert base64.b64decode(uris[0]) == (bundle / e2e["images"]["eager"]).read_bytes()
    assert 'id="end-to-end"' in page and f"{e2e['device']['cosine_distance']:.4g}" in page
    assert all(f"<td>{name}</td>" in page for name in ("text_encoder", "unet", "vae_decoder"))
    driver = chrome()
    try:
        driver.get((tmp_path / "sd.html").as_uri())
        shown = driver.execute_script(
            "return Array.from(document.querySelectorAll('#end-to-end img')).map(function (i) {"
            "  var r = i.getBoundingClientRect(); return [i.complete, i.naturalWidth, r.top, r.left]; });")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert [s[:2] for s in shown] == [[True, 64]] * 3, shown
    assert len({round(s[2]) for s in shown}) == 1 and len({round(s[3]) for s in shown}) == 3  # one row
    assert errors == []
