"""The denoiser's cache shown (issue 43 item 5): where the manifest records insert_teacache's policy, report.html has a
cache section and ``cann-export inspect`` cache lines: the cached range, the threshold or interval, the steps the
export's measure skipped and the PSNR against the uncached image. A manifest is untrusted: non-finite numbers (the
strict writer's null + non_finite word, or a float handed in) and values of the wrong type render, never crash.
The real exported bundle's page (in Chromium) and inspect output are checked in test_teacache.py."""
import math

import pytest

from cann_export.cli.inspect_view import render as inspect_render
from cann_export.diffusion.cache_facts import cache_rows
from cann_export.diffusion.cache_spec import CacheSpec
from cann_export.report import html, pipeline_view


def _pipeline(measured):
    """A pipeline section with the cache a 3-block SD3 records for blocks 1..2 at threshold 0.5 (cache_spec's own
    section) and ``measured`` as its end-to-end cache entry (None: exported with --no-validate)."""
    spec = CacheSpec("transformer", "transformer_blocks", 1, 3, {
        "kind": "relative_l1", "threshold": 0.5, "context": False,
        "measures": "transformer.transformer_blocks.0.norm1 (the modulated input)"})
    section = {"class": "StableDiffusion3Pipeline", "cache": spec.section()}
    if measured is not None:
        section["end_to_end"] = {"passed": measured.get("passed"), "cache": measured}
    return section


MEASURED = {"passed": True, "steps": 8, "seconds": 4.2,
            "off": {"policy": {"kind": "relative_l1", "threshold": 0.0}, "max_abs": 0.0, "atol": 1e-4},
            "at_setting": {"policy": {"kind": "relative_l1", "threshold": 0.5}, "skipped": 3,
                           "skipped_steps": [2, 4, 5], "psnr_db": 31.25, "max_abs": 0.0625}}


def _multi_info(pipeline):
    """inspect's object for a multi-graph bundle with no components, as describe_multi shapes it."""
    return {"kind": "multi-graph", "path": "b", "format": "atc_ready", "bundle_kind": "diffusion-pipeline",
            "components": {}, "connections": [], "parity": {"passed": True}, "manifest_sha256": "0" * 64,
            "pipeline": pipeline}


def _page(pipeline):
    """The page's cache section (after the end-to-end one, when the manifest records that)."""
    view = pipeline_view.build(None, {"pipeline": pipeline, "files": {}})
    page = pipeline_view.render(view, html._badge, html._num)
    return page[page.index('<section id="cache">'):]


def test_the_policy_and_the_measure_are_shown_in_the_report_and_inspect():
    rows = dict(cache_rows(_pipeline(MEASURED)))
    assert rows["cached range"] == "transformer.transformer_blocks.1..2 (blocks 1 to 2)"
    assert "threshold 0.5" in rows["policy"] and "TeaCache" in rows["policy"] and "first step" in rows["policy"]
    assert rows["measured at export"] == ("3 of 8 steps skipped (steps 2, 4, 5); PSNR 31.25 dB against the uncached "
                                          "image (max |diff| 0.0625)")
    assert rows["cache off"] == "threshold 0: max |diff| 0 against the uncached image (atol 0.0001)"
    assert rows["verdict"].startswith("passed")
    page = _page(_pipeline(MEASURED))
    assert page.startswith('<section id="cache">') and "PSNR 31.25 dB" in page and "badge pass" in page
    lines = inspect_render(_multi_info(_pipeline(MEASURED)))
    at = lines.index("denoiser cache (insert_teacache):")
    assert "  cached range: transformer.transformer_blocks.1..2 (blocks 1 to 2)" in lines[at:]
    assert any(line.startswith("  measured at export: 3 of 8 steps skipped") for line in lines[at:])


def test_a_cache_exported_without_validation_shows_its_policy_not_measured():
    view = pipeline_view.build(None, {"pipeline": _pipeline(None), "files": {}})
    page = pipeline_view.render(view, html._badge, html._num)
    assert page.startswith('<section id="cache">') and "not measured (exported with --no-validate)" in page
    assert 'id="end-to-end"' not in page and "threshold 0.5" in page and "badge none" in page
    assert pipeline_view.build(None, {"pipeline": {"class": "StableDiffusion3Pipeline"}, "files": {}}) is None


def test_a_deepcache_interval_and_an_equal_image_read_as_such():
    spec = CacheSpec("unet", "mid_block", 0, 1, {"kind": "interval", "every": 2, "context": False})
    measured = {**MEASURED, "at_setting": {"skipped": 0, "skipped_steps": [], "psnr_db": None, "max_abs": 0.0},
                "off": {"policy": {"kind": "interval", "every": 1}, "max_abs": 0.0, "atol": 1e-4}}
    rows = dict(cache_rows({"cache": spec.section(), "end_to_end": {"cache": measured}}))
    assert rows["cached range"] == "unet.mid_block (block 0)"
    assert rows["policy"].startswith("DeepCache: the full graph every 2 steps")
    assert rows["measured at export"] == "0 of 8 steps skipped; the image equals the uncached one"
    assert rows["cache off"].startswith("every 1 step: max |diff| 0")


NONFINITE = [
    # the strict JSON writer's form: null beside the word in non_finite
    ({"skipped": 2, "skipped_steps": [3, 4], "psnr_db": None, "max_abs": None,
      "non_finite": {"psnr_db": "inf", "max_abs": "nan"}}, ["PSNR inf dB", "max |diff| nan"]),
    # floats handed in as they are
    ({"skipped": 2, "psnr_db": math.inf, "max_abs": math.nan}, ["PSNR inf dB", "max |diff| nan"]),
    ({"skipped": 2, "psnr_db": -math.inf, "max_abs": None}, ["PSNR -inf dB", "max |diff| n/a"]),
]


@pytest.mark.parametrize("at_setting,words", NONFINITE)
def test_non_finite_numbers_render_as_their_words(at_setting, words):
    measured = {**MEASURED, "passed": False, "at_setting": at_setting}
    measured["off"] = {"max_abs": None, "atol": 1e-4, "non_finite": {"max_abs": "nan"}, "policy": {"threshold": 0.0}}
    text = dict(cache_rows(_pipeline(measured)))
    assert all(w in text["measured at export"] for w in words), text
    assert "max |diff| nan" in text["cache off"] and text["verdict"].startswith("FAILED")
    page = _page(_pipeline(measured))
    assert all(w in page for w in words) and "badge fail" in page
    assert all(any(w in line for line in inspect_render(_multi_info(_pipeline(measured)))) for w in words)


WRONG = [
    {"cache": {"module": 5, "range": "a", "policy": "x", "graphs": [1], "force_full": 7}},
    {"cache": {"policy": {"kind": "relative_l1", "threshold": "\x1b[31mred", "measures": ["a"]}},
     "end_to_end": {"cache": {"steps": {"a": 1}, "at_setting": {"skipped_steps": "abc", "psnr_db": "1e9"},
                              "off": {"policy": 3}, "passed": "yes"}}},
    {"cache": {"policy": {"kind": "unknown", "every": float("nan")}, "range": [0, 10 ** 400 // 10 ** 399]},
     "end_to_end": {"cache": {"at_setting": {"skipped_steps": list(range(100)), "max_abs": 0}, "off": None}}},
    {"cache": {"module": "x" * 10_000}, "end_to_end": 3},
    # an integer past float's range (JSON allows it) and a boolean bound: shown as text, never an OverflowError
    {"cache": {"policy": {"kind": "relative_l1", "threshold": 10 ** 400}, "range": [0, True]},
     "end_to_end": {"cache": {"at_setting": {"psnr_db": -10 ** 400}}}},
]


@pytest.mark.parametrize("pipeline", WRONG)
def test_values_of_the_wrong_type_render_without_crashing(pipeline):
    rows = cache_rows(pipeline)
    assert rows and all(isinstance(a, str) and isinstance(b, str) and len(b) < 2000 for a, b in rows)
    page = _page(pipeline)
    assert page.startswith('<section id="cache">') and "\x1b" not in page
    lines = _cache_lines(pipeline)
    assert lines and not any("\x1b" in line for line in lines)


def _cache_lines(pipeline):
    lines = inspect_render(_multi_info(pipeline))
    return lines[lines.index("denoiser cache (insert_teacache):"):]


def test_no_cache_recorded_means_no_section_and_no_lines():
    assert cache_rows({"class": "StableDiffusionPipeline"}) == [] and cache_rows(None) == []
    assert "denoiser cache" not in "\n".join(inspect_render(_multi_info({"class": "StableDiffusionPipeline"})))
