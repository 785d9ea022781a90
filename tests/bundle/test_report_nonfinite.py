"""report.html never fails an export that validated: ALBERT (transformers, small config, random weights, captured with
torch.export) with a padded attention mask fills masked scores with float32's lowest value, whose squares overflow a
float32 sum (the per-layer cosine was NaN and the strict JSON dump ended the export). Any NaN / inf reaching a page
(a per-layer point, a metric, a warning) renders as a gap and a label; shapes read as ``[1, 3, 224, 224]``,
warnings as a list, and the page names the model."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cann_export.fs.jsonio import loads_strict, sanitize
from cann_export.report import html, view
from cann_export.validators.device_verdict import DevicePolicy
from cann_export.validators.layers import metrics

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def page_data(text: str) -> dict:
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    return loads_strict(blob)  # strict: NaN / Infinity are errors


def run_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{ROOT}:{TESTS}", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-m", "cann_export", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="session")
def albert_pt2(tmp_path_factory) -> Path:
    import torch
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=37, max_position_embeddings=128)
    model = AlbertModel(config).eval()
    ids = torch.randint(0, 100, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 32:] = 0  # padding: masked scores at float32's lowest value
    path = tmp_path_factory.mktemp("albert") / "m.pt2"
    torch.export.save(torch.export.export(model, (ids, mask)), str(path))
    return path


def test_albert_pt2_exports_with_default_options_and_its_report_is_strict_json(albert_pt2):
    work = albert_pt2.parent
    r = run_cli(albert_pt2.name, cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    bundle = work / "m_atc_ready"
    data = page_data((bundle / "report.html").read_text())
    points = data["layers"]["points"]
    assert len(points) > 10 and all(isinstance(p["cosine"], float) for p in points)
    assert data["model_name"] == "m_atc_ready" and data["verdict"]["passed"] is True
    masked = [p for p in points if p["max_abs"] > 1e30]  # the mask fill saturates at fp16's bound on the device
    assert masked and all(0.0 <= p["cosine"] <= 1.0 for p in masked)
    assert run_cli("validate", bundle.name, cwd=work).returncode == 0


def test_the_cosine_of_values_past_float32_square_range_is_finite():
    policy = DevicePolicy()
    low = np.finfo(np.float32).min
    expected = np.full(8192, low, np.float32)
    expected[::2] = 0.0
    actual = np.where(expected == low, np.float32(-65504.0), expected).astype(np.float32)  # saturated fp16
    got = metrics(actual, expected, policy, 2.0 ** -10, 65504.0)
    assert all(math.isfinite(got[k]) for k in ("cosine", "max_rel", "max_abs")), got
    assert got["overflow"] and not got["passed"]
    zeros = np.zeros(8192, np.float32)
    assert metrics(zeros, zeros, policy, 2.0 ** -10, None)["cosine"] == 1.0  # two all-zero values agree
    assert metrics(zeros + 1, zeros, policy, 2.0 ** -10, None)["cosine"] == 0.0


def _view_with_non_finite() -> dict:
    nan, inf = float("nan"), float("inf")
    point = {"tensor": "t", "node": "n", "op_type": "Add", "module": "m", "source": None, "overflow": False,
             "passed": True, "kept": False, "max_abs": 0.0}
    points = [{**point, "index": i, "tensor": f"t{i}", "node": f"n{i}", "cosine": c, "max_rel": r}
              for i, (c, r) in enumerate([(1.0, 1e-4), (nan, 1e-4), (0.999, inf), (1.0, nan), (-inf, 1e-3)])]
    manifest = {"format": "atc_ready", "parity": {
        "validated": True, "passed": False, "reason": "cosine nan",
        "fp32": {"passed": True, "outputs": [{"name": "y", "cosine": nan, "max_abs": inf, "max_rel": -inf,
                                              "passed": True}]},
        "device": {"passed": False, "outputs": [{"name": "y", "cosine": nan, "max_abs": 0.5, "passed": False}]},
        "shapes": [{"shape": {"x": [1, 3, 224, 224]}, "fp32": True, "device": False, "passed": False}]},
        "warnings": {"tracer": ["one <b>", "two"], "noise": nan, "note": "plain text"}}
    layers = {"mode": "fp16", "input_set": 0, "values": 5, "points": points, "truncated": False}
    return view.build(manifest, layers, {}, "comp", model_name="whisper_atc_ready", component="decoder")


def test_the_renderer_turns_nan_and_inf_into_gaps_and_labels():
    page = html.render(_view_with_non_finite())
    data = page_data(page)
    cos = [p["cosine"] for p in data["layers"]["points"]]
    assert cos[1] is None and data["layers"]["points"][1]["non_finite"] == {"cosine": "nan"}
    assert data["layers"]["points"][2]["non_finite"] == {"max_rel": "inf"}
    assert data["outputs"][0]["fp32"]["non_finite"] == {"cosine": "nan", "max_abs": "inf", "max_rel": "-inf"}
    svg = page.split('<svg id="curve"', 1)[1].split("</svg>", 1)[0]
    assert svg.count('class="pt gap cos"') == 2 and svg.count('class="pt gap rel"') == 2  # a label per gap
    assert "nan" not in re.sub(r"<title>.*?</title>|>n/a<", "", svg).lower()  # no NaN coordinate
    assert len(re.findall(r'<polyline class="trace"', svg)) >= 4  # the traces break at the gaps
    assert '<span class="nonfinite">nan</span>' in page and '<span class="nonfinite">inf</span>' in page


def test_shapes_warnings_and_the_model_name_read_as_text():
    page = html.render(_view_with_non_finite())
    assert "<code>x [1, 3, 224, 224]</code>" in page and "{&quot;" not in page
    warnings = page.split('<ul id="warnings">', 1)[1]
    assert "<li>one &lt;b&gt;</li><li>two</li>" in warnings and "[&#x27;" not in warnings
    assert "<title>whisper_atc_ready / decoder: cann-export report</title>" in page
    assert re.search(r"<h1>whisper_atc_ready &middot; component <code>decoder</code>", page)


def test_inspect_and_ci_summaries_render_a_bundle_with_non_finite_metrics(tmp_path):
    """A manifest holds null where a metric was NaN / inf (the strict encoder's ``non_finite`` labels)."""
    from cann_export.bundle import summaries
    from cann_export.cli.inspect_view import _parity

    manifest = json.loads(json.dumps(sanitize(
        {"format": "atc_ready", "parity": {
            "validated": True, "passed": False,
            "fp32": {"passed": True, "outputs": [{"name": "y", "cosine": float("nan"), "max_abs": float("inf"),
                                                  "max_rel": 0.0, "passed": True}]},
            "device": {"passed": False, "outputs": [{"name": "y", "cosine": float("nan"), "max_abs": 0.5,
                                                     "max_rel": float("nan"), "passed": False}]}},
         "model": {"outputs": [{"name": "y"}]}})))
    text = "\n".join(_parity(manifest["parity"], "", True))
    assert "cosine nan" in text or "cosine n/a" in text, text
    markdown = summaries.markdown("export", "m.pt2", {None: manifest})
    junit = summaries.junit("export", "m.pt2", {None: manifest}, 1.0, str(tmp_path))
    assert "y" in markdown and "<testcase" in junit


def test_a_page_with_non_finite_values_in_a_real_browser(tmp_path):
    """The page parses (strict JSON), draws, and its hover box labels a gap, in headless Chromium."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from helpers.browser import chrome

    page = tmp_path / "nan.html"
    page.write_text(html.render(_view_with_non_finite()))
    browser = chrome()
    try:
        browser.get(page.resolve().as_uri())
        assert not [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        gaps = browser.find_elements(By.CSS_SELECTOR, "#curve .pt.gap.cos")
        assert len(gaps) == 2 and len(browser.find_elements(By.CSS_SELECTOR, "#curve circle.cos")) == 3
        ActionChains(browser).move_to_element(gaps[0]).perform()
        tip = browser.find_element(By.ID, "tip")
        assert tip.is_displayed() and "cosine nan (not a finite number)" in tip.text, tip.text
    finally:
        browser.quit()
