"""A diffusers pipeline exported as one checked bundle (issue 43): a tiny SD3 pipeline directory through the CLI
with no flags and a tiny StableDiffusionPipeline from Python; each component's graph against diffusers in
onnxruntime, the end-to-end check in diffusers' own loop, validate / inspect, and the bundle's runner giving
diffusers' image for the same seed. Real exports: minutes on 2 shared cores, so marked slow."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from cann_export.cli.main import cli

pytestmark = pytest.mark.slow

SD3_COMPONENTS = ["text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae_encoder", "vae_decoder"]


@pytest.fixture(scope="session")
def sd3(tmp_path_factory):
    from diffusers import StableDiffusion3Pipeline

    from helpers.tiny_diffusion import save, sd3_pipeline

    root = tmp_path_factory.mktemp("sd3")
    save(sd3_pipeline(), root / "sd3-dir")
    # the reference: the directory as diffusers loads it (its modules in eval mode, as export computes)
    pipe = StableDiffusion3Pipeline.from_pretrained(root / "sd3-dir", local_files_only=True)
    res = CliRunner().invoke(cli, [str(root / "sd3-dir"), "-o", str(root / "sd3_bundle"), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return pipe, root


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_sd3_directory_exports_every_component_with_optimum_names_and_verdicts(sd3):
    _, root = sd3
    manifest = _manifest(root / "sd3_bundle")
    assert [c["name"] for c in manifest["components"]] == SD3_COMPONENTS
    named = {c["name"]: (c["inputs"], c["outputs"]) for c in manifest["components"]}
    assert named["transformer"] == (["hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"],
                                    ["out_hidden_states"])
    assert named["vae_decoder"] == (["latent_sample"], ["sample"])
    assert named["vae_encoder"] == (["sample"], ["latent_parameters"])
    assert named["text_encoder_3"] == (["input_ids"], ["last_hidden_state"])
    assert named["text_encoder"][1][:2] == ["text_embeds", "last_hidden_state"]
    for name in SD3_COMPONENTS:
        own = json.loads((root / "sd3_bundle" / "components" / name / "manifest.json").read_text())
        assert own["parity"]["fp32"]["passed"] is True, name
        assert own["parity"]["device"]["passed"] is True, name
        batch = own["model"]["inputs"][0]["shape"][0]
        assert batch == "batch_size", (name, own["model"]["inputs"])
    assert (root / "sd3_bundle" / "pipeline" / "model_index.json").read_bytes() == \
        (root / "sd3-dir" / "model_index.json").read_bytes()
    section = manifest["pipeline"]
    assert section["class"] == "StableDiffusion3Pipeline" and section["scheduler"] == "FlowMatchEulerDiscreteScheduler"
    assert {"tokenizer", "tokenizer_2", "tokenizer_3", "scheduler", "transformer", "vae"} <= set(section["parts"])
    assert ("transformer", "out_hidden_states", "vae_decoder", "latent_sample") in {
        (c["from"]["component"], c["from"]["output"], c["to"]["component"], c["to"]["input"])
        for c in manifest["connections"]}


def test_sd3_components_are_traced_and_hints_name_their_nodes_by_module_path(sd3):
    """TorchScript first, as Optimum traces (the transformer's trace warns and is kept after the trace check); the
    traced nodes keep the module paths component-qualified hints name (the VAE's included: its graphs call
    ``vae.encode`` / ``vae.decode``, not the module)."""
    import onnx

    from cann_export.atc.command import keep_dtype_nodes
    from cann_export.diffusion.component_hints import pipeline_hints
    from cann_export.graph.module_paths import collect

    pipe, root = sd3
    for name in SD3_COMPONENTS:
        own = _manifest(root / "sd3_bundle" / "components" / name)
        assert own["capture"]["exporter"] == "torchscript", (name, own["capture"])
    named = ["transformer.transformer_blocks.0", "vae_decoder.decoder.up_blocks.0", "vae_encoder.encoder.mid_block",
             "text_encoder_3.encoder.block.0"]
    hints, said = pipeline_hints(pipe, {"keep_dtype": named})
    assert not said and len(hints) == 4, (hints, said)
    for key, paths in hints.items():
        model = onnx.load(root / "sd3_bundle" / "components" / key.split(":")[0] / "model.onnx")
        _, mapping = keep_dtype_nodes(paths, model, collect(model))
        assert all(mapping[path] for path in paths), key


def test_sd3_end_to_end_check_in_diffusers_loop_passes_fp32_and_device(sd3):
    _, root = sd3
    e2e = _manifest(root / "sd3_bundle")["pipeline"]["end_to_end"]
    assert e2e["passed"] is True, e2e
    assert e2e["fp32"]["latents_max_abs"] <= 1e-3 and e2e["fp32"]["tolerance"] == {"atol": 1e-4, "rtol": 1e-2}
    assert e2e["device"]["cosine_distance"] < 5e-2
    assert set(e2e["device"]["nonfinite"]) == {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer",
                                               "vae_decoder"}


def test_the_end_to_end_check_runs_each_loop_once_for_its_latents_and_image(sd3):
    """The check's latents and image come from one run of each loop (eager, onnxruntime), equal to what two runs
    (``output_type="latent"``, then ``"np"``) give; the denoiser is called once per step, not twice."""
    from cann_export.diffusion import end_to_end

    pipe, root = sd3
    calls = []
    hook = pipe.transformer.register_forward_hook(lambda *_: calls.append(1))
    try:
        result = end_to_end.check(pipe, root / "sd3_bundle")
    finally:
        hook.remove()
    assert result["passed"] is True and len(calls) == end_to_end.STEPS, (len(calls), result)
    latents, image = end_to_end.generate_with_latents(pipe)
    np.testing.assert_array_equal(latents, end_to_end.generate(pipe, "latent"))
    np.testing.assert_array_equal(image, end_to_end.generate(pipe, "np"))


def test_sd3_graph_in_onnxruntime_equals_diffusers_module(sd3):
    import onnxruntime as ort
    import torch

    pipe, root = sd3
    ids = torch.randint(0, 40, (1, 256), generator=torch.Generator().manual_seed(3))
    sess = ort.InferenceSession(str(root / "sd3_bundle/components/text_encoder_3/model.onnx"))
    got = sess.run(["last_hidden_state"], {"input_ids": ids.numpy()})[0]
    with torch.no_grad():
        want = pipe.text_encoder_3(ids)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    latents = torch.randn(3, 4, 32, 32, generator=torch.Generator().manual_seed(4))  # a batch of 3: dynamic
    sess = ort.InferenceSession(str(root / "sd3_bundle/components/vae_decoder/model.onnx"))
    got = sess.run(["sample"], {"latent_sample": latents.numpy()})[0]
    with torch.no_grad():
        want = pipe.vae.decode(latents, return_dict=False)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_sd3_bundle_validates_and_inspects(sd3):
    _, root = sd3
    report = CliRunner().invoke(cli, ["validate", str(root / "sd3_bundle"), "--json"], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    shown = json.loads(report.stdout)
    assert set(shown["components"]) == set(SD3_COMPONENTS), shown
    shown = CliRunner().invoke(cli, ["inspect", str(root / "sd3_bundle")], catch_exceptions=False)
    assert shown.exit_code == 0 and "transformer" in shown.output


def test_a_doctored_end_to_end_verdict_is_refused_by_validate(sd3, tmp_path):
    import shutil

    _, root = sd3
    bundle = tmp_path / "b"
    shutil.copytree(root / "sd3_bundle", bundle)
    manifest = _manifest(bundle)
    manifest["pipeline"]["end_to_end"]["device"]["cosine_distance"] = 0.5
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(cli, ["validate", str(bundle)])
    assert res.exit_code == 2 and "end_to_end.device.passed" in res.output, res.output


def test_the_runner_gives_diffusers_image_for_the_same_seed(sd3):
    import torch

    import cann_export

    pipe, root = sd3
    runner = cann_export.load(root / "sd3_bundle")
    call = {"prompt": "a dog", "num_inference_steps": 3, "guidance_scale": 4.0, "output_type": "np"}
    got = runner(generator=torch.Generator().manual_seed(7), **call).images
    want = pipe(generator=torch.Generator().manual_seed(7), **call).images
    assert got.shape == want.shape == (1, 32, 32, 3)
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_a_unet_pipeline_exports_from_python_and_runs_back(sd):
    import torch

    import cann_export

    pipe, root = sd
    manifest = _manifest(root / "sd_bundle")
    assert [c["name"] for c in manifest["components"]] == ["text_encoder", "unet", "vae_encoder", "vae_decoder"]
    named = {c["name"]: (c["inputs"], c["outputs"]) for c in manifest["components"]}
    assert named["unet"] == (["sample", "timestep", "encoder_hidden_states"], ["out_sample"])
    assert manifest["pipeline"]["end_to_end"]["passed"] is True
    assert cann_export.validate(root / "sd_bundle")["passed"] is True
    runner = cann_export.load(root / "sd_bundle")
    got = runner(prompt="a cat", generator=torch.Generator().manual_seed(1), num_inference_steps=2,
                 output_type="np").images
    want = pipe(prompt="a cat", generator=torch.Generator().manual_seed(1), num_inference_steps=2,
                output_type="np").images
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_a_failing_end_to_end_record_fails_validate_and_the_export_verdict(sd3, tmp_path):
    import shutil

    import cann_export
    from cann_export.bundle.multi_write import multi_ok

    _, root = sd3
    bundle = tmp_path / "failing"
    shutil.copytree(root / "sd3_bundle", bundle)
    manifest = _manifest(bundle)
    e2e = manifest["pipeline"]["end_to_end"]
    e2e["device"].update(passed=False, cosine_distance=0.4)
    e2e["passed"] = False
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert multi_ok(manifest) is False
    report = cann_export.validate(bundle)
    assert report["passed"] is False and report["end_to_end"]["device"]["cosine_distance"] == 0.4
    assert all(r["passed"] for r in report["components"].values())


def _own(bundle, name):
    return json.loads((bundle / "components" / name / "manifest.json").read_text())


def _sides(own):
    """The (min, max) of the first input's height and width in the component's ATC --input_shape."""
    shape = next(a for a in own["atc"]["command"] if a.startswith("--input_shape=")).split("=", 1)[1]
    dims = shape.split(";")[0].split(":")[1].split(",")
    return [tuple(int(v) for v in d.split("~")) for d in dims[2:4]]


def test_unet_and_vae_graphs_take_latent_sides_other_than_the_example(sd):
    """The UNet and VAE graphs keep the latent height / width dynamic (side_range: half to twice the sample size
    of 32; the VAE encoder's image sides are those times the VAE's scale factor, 2 here); in onnxruntime at a
    size that is no example they equal diffusers' modules, and the runner makes diffusers' image at that size."""
    import onnxruntime as ort
    import torch

    import cann_export

    pipe, root = sd
    bundle = root / "sd_bundle"
    for name, first in (("unet", "sample"), ("vae_decoder", "latent_sample")):
        own = _own(bundle, name)
        assert own["model"]["inputs"][0] == {"name": first, "shape": ["batch_size", 4, "height", "width"],
                                             "dtype": "float"}
        assert _sides(own) == [(16, 64), (16, 64)], name
    own = _own(bundle, "vae_encoder")
    assert own["model"]["inputs"][0]["shape"] == ["batch_size", 3, "image_height", "image_width"]
    assert _sides(own) == [(32, 128), (32, 128)]
    gen = torch.Generator().manual_seed(5)
    latents, text = torch.randn(2, 4, 24, 40, generator=gen), torch.randn(2, 77, 32, generator=gen)
    timestep = torch.tensor([700.0, 20.0])
    sess = ort.InferenceSession(str(bundle / "components/unet/model.onnx"))
    got = sess.run(["out_sample"], {"sample": latents.numpy(), "timestep": timestep.numpy(),
                                    "encoder_hidden_states": text.numpy()})[0]
    with torch.no_grad():
        want = pipe.unet(latents, timestep, encoder_hidden_states=text, return_dict=False)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    sess = ort.InferenceSession(str(bundle / "components/vae_decoder/model.onnx"))
    got = sess.run(["sample"], {"latent_sample": latents.numpy()})[0]
    with torch.no_grad():
        want = pipe.vae.decode(latents, return_dict=False)[0].numpy()
    assert got.shape == (2, 3, 48, 80)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    image = torch.rand(1, 3, 48, 80, generator=gen) * 2 - 1
    sess = ort.InferenceSession(str(bundle / "components/vae_encoder/model.onnx"))
    got = sess.run(["latent_parameters"], {"sample": image.numpy()})[0]
    with torch.no_grad():
        want = pipe.vae.encode(image, return_dict=False)[0].parameters.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    runner = cann_export.load(bundle)
    call = {"prompt": "a cat", "num_inference_steps": 2, "height": 48, "width": 80, "output_type": "np"}
    got = runner(generator=torch.Generator().manual_seed(2), **call).images
    want = pipe(generator=torch.Generator().manual_seed(2), **call).images
    assert got.shape == want.shape == (1, 48, 80, 3)
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_the_runner_refuses_a_size_outside_the_graphs_naming_their_range(sd):
    import torch

    import cann_export
    from cann_export.errors import OptionsError

    _, root = sd
    runner = cann_export.load(root / "sd_bundle")
    with pytest.raises(OptionsError) as caught:
        runner(prompt="a cat", num_inference_steps=1, height=160, width=64, output_type="np",
               generator=torch.Generator().manual_seed(2))
    text = str(caught.value)
    assert "height 160" in text and "32..128" in text and "--dynamic height=" in text, text


def test_sd3_keeps_the_transformer_sides_fixed_saying_why_and_the_vae_dynamic(sd3):
    _, root = sd3
    bundle = root / "sd3_bundle"
    manifest = _manifest(bundle)
    assert "transformer" in manifest["run"]["fixed_sides"]
    assert "position" in manifest["run"]["fixed_sides"]["transformer"]
    assert _own(bundle, "transformer")["model"]["inputs"][0]["shape"] == ["batch_size", 4, 32, 32]
    assert _own(bundle, "vae_decoder")["model"]["inputs"][0]["shape"] == ["batch_size", 4, "height", "width"]
