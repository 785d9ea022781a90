"""insert_teacache as a cache the bundle applies (issue 43 item 5): the denoiser's graph variants (the full graph that
also outputs the cached range's residual, the skip graph taking it as an input, the probe giving TeaCache's
modulated input), the policy in the manifest and the runner applying it in diffusers' loop. The cache off equals no
cache; the steps skipped and the PSNR at the recorded setting are measured at export. Bad hints: exit 2."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cann_export.cli.main import cli

SD3_LAYERS = 3


def _sd3_transformer():
    from helpers.tiny_diffusion import sd3_components

    return sd3_components(layers=SD3_LAYERS)["transformer"].eval()


def _spec(pipe, hints):
    from cann_export.diffusion.cache_spec import cache_spec

    spec, _ = cache_spec(pipe, hints)
    return spec


class _SD3:
    """What cache_spec reads of a pipeline: its class name and its denoiser."""

    def __init__(self, transformer):
        self.transformer = transformer


_SD3.__name__ = "StableDiffusion3Pipeline"


@pytest.mark.parametrize("blocks", ["transformer.transformer_blocks.1", "transformer.transformer_blocks.1..2",
                                    "transformer.transformer_blocks.0..1"])
def test_dit_skip_graph_fed_the_full_graphs_residual_gives_the_full_output(blocks):
    from cann_export.diffusion.cache_graphs import full_graph, skip_graph
    from cann_export.diffusion.graphs import SD3Transformer

    transformer = _sd3_transformer()
    spec = _spec(_SD3(transformer), {"insert_teacache": [blocks]})
    gen = torch.Generator().manual_seed(1)
    feed = {"hidden_states": torch.randn(2, 4, 32, 32, generator=gen),
            "encoder_hidden_states": torch.randn(2, 10, 32, generator=gen),
            "pooled_projections": torch.randn(2, 64, generator=gen), "timestep": torch.tensor([500.0, 250.0])}
    with torch.no_grad():
        want = SD3Transformer(transformer, (16, 64))(**feed)["out_hidden_states"]
        full = full_graph("transformer", transformer, (16, 64), spec)(**feed)
        skip = skip_graph("transformer", transformer, (16, 64), spec)
        got = skip(**feed, **{n: full[n] for n in skip.residuals})["out_hidden_states"]
    torch.testing.assert_close(full["out_hidden_states"], want, atol=0, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # the range ends before the last block: the text stream's residual is carried too
    assert ("cache_residual_context" in full) is (spec.end < SD3_LAYERS)
    skipped = [m for m in skip.model.transformer_blocks.modules() if type(m).__name__ == "JointTransformerBlock"]
    assert len(skipped) == SD3_LAYERS - (spec.end - spec.start)  # the range is not in the skip graph
    assert len(transformer.transformer_blocks) == SD3_LAYERS  # the user's module untouched


def test_unet_mid_block_skip_graph_gives_the_full_output():
    from cann_export.diffusion.cache_graphs import full_graph, skip_graph
    from cann_export.diffusion.graphs import UNet
    from helpers.tiny_diffusion import sd_pipeline

    pipe = sd_pipeline()
    spec = _spec(pipe, {"insert_teacache": ["unet.mid_block"]})
    assert spec.policy == {"kind": "interval", "every": 2, "context": False}
    gen = torch.Generator().manual_seed(2)
    feed = {"sample": torch.randn(2, 4, 32, 32, generator=gen), "timestep": torch.tensor([500.0, 250.0]),
            "encoder_hidden_states": torch.randn(2, 77, 32, generator=gen)}
    with torch.no_grad():
        want = UNet(pipe.unet, (16, 64))(**feed)["out_sample"]
        full = full_graph("unet", pipe.unet, (16, 64), spec)(**feed)
        got = skip_graph("unet", pipe.unet, (16, 64), spec)(**feed, cache_residual=full["cache_residual"])
    torch.testing.assert_close(full["out_sample"], want, atol=0, rtol=0)
    torch.testing.assert_close(got["out_sample"], want, atol=1e-5, rtol=1e-4)
    assert float(full["cache_residual"].abs().max()) > 0


def test_threshold_zero_never_skips_and_a_threshold_skips_small_changes():
    from cann_export.diffusion.cached_denoiser import StepPolicy

    base = np.ones((2, 4), np.float32)
    steps = [base * (1 + 0.01 * i) for i in range(6)]
    off = StepPolicy({"kind": "relative_l1", "threshold": 0.0})
    assert [off.full(i, i == 5, m) for i, m in enumerate(steps)] == [True] * 6
    on = StepPolicy({"kind": "relative_l1", "threshold": 0.025})
    # changes of ~1% accumulate: skipped until the sum reaches 2.5%, the last step always full
    assert [on.full(i, i == 5, m) for i, m in enumerate(steps)] == [True, False, False, True, False, True]
    every = StepPolicy({"kind": "interval", "every": 3})
    assert [every.full(i, i == 6, None) for i in range(7)] == [True, False, False, True, False, False, True]


@pytest.mark.parametrize(("hint", "words"), [
    ("transformer.transformer_blocks.5", ["outside the model", "transformer.transformer_blocks.0..0"]),
    ("transformer.transformer_blocks.0..3", ["outside the model", "1 blocks"]),
    ("denoiser.blocks.0", ["names no component", "transformer, vae_encoder"]),
    ("text_encoder_3.encoder.block.0", ["not in the denoiser"]),
    ("transformer.norm_out", ["can cache transformer.transformer_blocks.0..0"]),
])
def test_a_bad_teacache_hint_is_refused_naming_the_hint_exit_2_nothing_written(sd3_directory, tmp_path, hint, words):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [str(sd3_directory), "-o", str(out), "--atc-hint", f"insert_teacache={hint}"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "insert_teacache" in res.output and hint in res.output
    for word in words:
        assert word in res.output, res.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name != "out"]


def test_a_threshold_without_a_range_is_refused(sd3_directory, tmp_path):
    res = CliRunner().invoke(cli, [str(sd3_directory), "-o", str(tmp_path / "out"), "--atc-hint",
                                   "teacache_threshold=0.2"])
    assert res.exit_code == 2 and "teacache_threshold / teacache_interval set without insert_teacache" in \
        res.output, res.output
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def sd3_directory(tmp_path_factory):
    from helpers.tiny_diffusion import save, sd3_pipeline

    return save(sd3_pipeline(), tmp_path_factory.mktemp("sd3") / "sd3-dir")


THRESHOLD = 0.5


@pytest.fixture(scope="module")
def cached_sd3(tmp_path_factory):
    """A 3-block SD3 exported through the CLI with blocks 1..2 cached at a threshold that skips steps."""
    from helpers.tiny_diffusion import save, sd3_pipeline

    root = tmp_path_factory.mktemp("sd3c")
    save(sd3_pipeline(layers=SD3_LAYERS), root / "dir")
    res = CliRunner().invoke(cli, [str(root / "dir"), "-o", str(root / "bundle"), "--atc-hint",
                                   "insert_teacache=transformer.transformer_blocks.1..2", "--atc-hint",
                                   f"teacache_threshold={THRESHOLD}"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return root / "bundle"


@pytest.mark.slow
def test_cached_dit_bundle_records_variants_policy_and_measure(cached_sd3):
    manifest = json.loads((cached_sd3 / "manifest.json").read_text())
    names = [c["name"] for c in manifest["components"]]
    assert names == ["text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "transformer_cache_skip",
                     "transformer_cache_probe", "vae_encoder", "vae_decoder"]
    io = {c["name"]: (c["inputs"], c["outputs"]) for c in manifest["components"]}
    assert io["transformer"][1] == ["out_hidden_states", "cache_residual"]
    assert io["transformer_cache_skip"] == (["hidden_states", "encoder_hidden_states", "pooled_projections",
                                             "timestep", "cache_residual"], ["out_hidden_states"])
    assert io["transformer_cache_probe"][1] == ["modulated_input"]
    for name in ("transformer", "transformer_cache_skip", "transformer_cache_probe"):
        own = json.loads((cached_sd3 / "components" / name / "manifest.json").read_text())
        assert own["parity"]["fp32"]["passed"] is True and own["parity"]["device"]["passed"] is True, name
    cache = manifest["pipeline"]["cache"]
    assert cache["module"] == "transformer.transformer_blocks.1..2" and cache["range"] == [1, 3]
    assert cache["policy"]["kind"] == "relative_l1" and cache["policy"]["threshold"] == THRESHOLD
    assert ("transformer", "cache_residual", "transformer_cache_skip", "cache_residual") in {
        (c["from"]["component"], c["from"]["output"], c["to"]["component"], c["to"]["input"])
        for c in manifest["connections"]}
    e2e = manifest["pipeline"]["end_to_end"]
    measured = e2e["cache"]
    assert e2e["passed"] is True and measured["passed"] is True, e2e
    assert measured["off"]["max_abs"] <= 1e-4  # the cache off is the uncached run
    assert measured["at_setting"]["skipped"] >= 1 and measured["at_setting"]["psnr_db"] is not None, measured
    assert 0 not in measured["at_setting"]["skipped_steps"] and measured["steps"] - 1 not in \
        measured["at_setting"]["skipped_steps"]


@pytest.mark.slow
def test_cached_bundle_validates_and_its_runner_applies_the_cache(cached_sd3):
    import cann_export
    from cann_export.diffusion.cached_denoiser import skipped_steps

    res = CliRunner().invoke(cli, ["validate", str(cached_sd3), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    measured = json.loads((cached_sd3 / "manifest.json").read_text())["pipeline"]["end_to_end"]["cache"]
    call = {"prompt": "a photo of a cat", "num_inference_steps": measured["steps"], "guidance_scale": 5.0,
            "output_type": "np"}
    cached = cann_export.load(cached_sd3)
    image = cached(generator=torch.Generator().manual_seed(0), **call).images
    assert skipped_steps(cached) == measured["at_setting"]["skipped_steps"]
    plain = cann_export.load(cached_sd3, cache=False)
    reference = plain(generator=torch.Generator().manual_seed(0), **call).images
    assert np.max(np.abs(image - reference)) == pytest.approx(measured["at_setting"]["max_abs"], abs=1e-5)


@pytest.mark.slow
def test_a_doctored_cache_section_is_refused_by_validate(cached_sd3, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(cached_sd3, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["pipeline"]["cache"]["range"] = [0, 3]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(cli, ["validate", str(bundle)])
    assert res.exit_code != 0 and "pipeline.cache" in res.output, res.output


@pytest.mark.slow
def test_the_articles_mid_block_hint_caches_a_unet_pipeline(tmp_path):
    import cann_export
    from helpers.tiny_diffusion import sd_pipeline

    result = cann_export.export(sd_pipeline(), tmp_path / "sd", atc_hints={"insert_teacache": ["unet.mid_block"]})
    assert result.ok, result.to_dict()
    manifest = json.loads((tmp_path / "sd" / "manifest.json").read_text())
    assert [c["name"] for c in manifest["components"]] == ["text_encoder", "unet", "unet_cache_skip", "vae_encoder",
                                                           "vae_decoder"]
    cache = manifest["pipeline"]["cache"]
    assert cache["module"] == "unet.mid_block" and cache["policy"]["kind"] == "interval"
    measured = manifest["pipeline"]["end_to_end"]["cache"]
    assert measured["off"]["max_abs"] <= 1e-4 and measured["at_setting"]["skipped"] >= 1, measured


def _report(bundle, page):
    """``cann-export report BUNDLE -o PAGE`` as a user runs it (report is a plugin command of the console script)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "cann_export", "report", str(bundle), "-o", str(page)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def _cache_lines(output):
    lines = output.splitlines()
    at = lines.index("denoiser cache (insert_teacache):")
    return lines[at:at + 7]


@pytest.mark.slow
def test_inspect_shows_the_recorded_cache_policy_and_measure(cached_sd3):
    measured = json.loads((cached_sd3 / "manifest.json").read_text())["pipeline"]["end_to_end"]["cache"]
    at = measured["at_setting"]
    res = CliRunner().invoke(cli, ["inspect", str(cached_sd3)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = _cache_lines(res.output)
    assert "  cached range: transformer.transformer_blocks.1..2 (blocks 1 to 2)" in lines, lines
    assert any(f"under the threshold {THRESHOLD}" in line for line in lines), lines
    steps = ", ".join(map(str, at["skipped_steps"]))
    assert any(line.startswith(f"  measured at export: {at['skipped']} of {measured['steps']} steps skipped "
                               f"(steps {steps}); PSNR {at['psnr_db']:.4g} dB") for line in lines), lines
    assert any(line.startswith("  verdict: passed") for line in lines), lines


@pytest.mark.slow
def test_the_report_shows_the_cache_in_chromium(cached_sd3, tmp_path):
    from helpers.browser import chrome

    at = json.loads((cached_sd3 / "manifest.json").read_text())["pipeline"]["end_to_end"]["cache"]["at_setting"]
    page = tmp_path / "cached.html"
    _report(cached_sd3, page)
    driver = chrome()
    try:
        driver.get(page.as_uri())
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('#cache tr')).map(function (r) {"
            "  return [r.cells[0].innerText, r.cells[1].innerText, r.getBoundingClientRect().height]; });")
        badge = driver.execute_script("return document.querySelector('#cache h2 .badge').innerText;")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    shown = {label: text for label, text, _ in rows}
    assert shown["cached range"] == "transformer.transformer_blocks.1..2 (blocks 1 to 2)", shown
    assert f"threshold {THRESHOLD}" in shown["policy"] and badge == "PASS"
    assert shown["measured at export"].startswith(f"{at['skipped']} of 8 steps skipped"), shown
    assert f"PSNR {at['psnr_db']:.4g} dB" in shown["measured at export"], shown
    assert all(height > 0 for *_, height in rows) and errors == []


@pytest.mark.slow
def test_a_non_finite_measure_renders_in_the_report_and_inspect(cached_sd3, tmp_path):
    """The strict JSON writer keeps a non-finite PSNR / max |diff| as null and its word: both views show the word."""
    import shutil

    from cann_export.fs.jsonio import dumps

    bundle = tmp_path / "b"
    shutil.copytree(cached_sd3, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["pipeline"]["end_to_end"]["cache"]["at_setting"].update(psnr_db=float("inf"), max_abs=float("nan"))
    (bundle / "manifest.json").write_text(dumps(manifest, indent=2))
    res = CliRunner().invoke(cli, ["inspect", str(bundle)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert any("PSNR inf dB against the uncached image (max |diff| nan)" in line for line in _cache_lines(res.output))
    _report(bundle, tmp_path / "b.html")
    assert "PSNR inf dB against the uncached image (max |diff| nan)" in (tmp_path / "b.html").read_text()
