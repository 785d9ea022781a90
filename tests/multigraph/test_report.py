"""A multi-graph bundle (a tiny GPT-2 with past: prefill + decode) and what happens around it: ``cann-export report``
writes one page beside the bundle (a section per component, each naming the model and the component), never inside
it, so validate and --overwrite keep working; the export's progress names each graph and stage."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.hf_models import tiny_decoder_gpt2

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TASK = ["--task", "text-generation-with-past"]


def run_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    return subprocess.run([sys.executable, "-m", "cann_export", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=900)


@pytest.fixture(scope="session")
def gpt2(tmp_path_factory) -> dict:
    """The tiny GPT-2 directory exported by the CLI (default options, atc_ready) into ``gpt2``; its stderr."""
    root = tmp_path_factory.mktemp("report_multi")
    tiny_decoder_gpt2(n_positions=32).save_pretrained(root / "gpt2-dir")
    run = run_cli("gpt2-dir", "-o", "gpt2", *TASK, cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    return {"root": root, "bundle": root / "gpt2", "stderr": run.stderr}


def page_data(path: Path) -> dict:
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', path.read_text(), re.S)
    return json.loads(blob.group(1))


def test_progress_names_each_graph_and_stage(gpt2):
    lines = gpt2["stderr"].splitlines()
    for graph in ("prefill", "decode"):
        mine = [ln for ln in lines if ln.startswith(f"[{graph} ")]
        assert any(re.match(rf"\[{graph} \d+/\d+\] capture \.\.\. ", ln) for ln in mine), lines
        assert len({re.match(r"\[\S+ (\d+)/", ln).group(1) for ln in mine}) >= 10, mine  # every stage, once
    assert not [ln for ln in lines if re.match(r"\[\d+/\d+\] ", ln)], lines  # no stage line without its graph
    assert any(ln.startswith("load model directory ... done") for ln in lines), lines
    assert lines[1].startswith("read config.json (task, graphs) ... done"), lines  # the first thing after the title


def test_a_progress_listener_hears_every_graph_and_the_load(gpt2, tmp_path):
    """What the CLI's live line draws: the events reach this process (the load ran in the sandbox's child), with
    the graph named, from the directory's load on."""
    import time

    import cann_export

    events: list = []
    cann_export.export(str(gpt2["root"] / "gpt2-dir"), tmp_path / "again", task="text-generation-with-past",
                       on_progress=lambda e: events.append((time.monotonic(), e)))
    starts = [e for _, e in events if e.kind == "start"]
    assert [e.stage for e in starts[:3]] == ["read config.json (task, graphs)", "load model directory",
                                             "plan graphs"], starts[:4]
    staged = [e for e in starts if e.index]
    assert {e.graph for e in staged} == {"prefill", "decode"} and all(e.stages == staged[0].stages for e in staged)
    assert [e.stage for e in staged if e.graph == "decode"][:2] == ["load", "prepare"]


def test_report_of_a_multi_graph_bundle_is_one_page_beside_it(gpt2):
    root = gpt2["root"]
    run = run_cli("report", "gpt2", cwd=root)
    assert run.returncode == 0, run.stderr[-2000:]
    page = root / "gpt2.report.html"
    data = page_data(page)
    assert data["model_name"] == "gpt2" and [v["component"] for v in data["components"]] == ["prefill", "decode"]
    assert all(v["model_name"] == "gpt2" and v["verdict"]["passed"] for v in data["components"])
    text = page.read_text()
    for name in ("prefill", "decode"):
        assert f'<h1>gpt2 &middot; component <code>{name}</code>' in text
    assert len(re.findall(r'<svg id="curve-\d" class="curve"', text)) == 2
    assert run_cli("validate", "gpt2", cwd=root).returncode == 0


def test_report_of_a_component_writes_beside_the_bundle_and_validate_still_passes(gpt2):
    root = gpt2["root"]
    run = run_cli("report", "gpt2/components/decode", cwd=root)
    assert run.returncode == 0, run.stderr[-2000:]
    data = page_data(root / "gpt2.decode.report.html")
    assert data["model_name"] == "gpt2" and data["component"] == "decode"
    assert not list((root / "gpt2").rglob("*.report.html"))
    check = run_cli("validate", "gpt2", cwd=root)
    assert check.returncode == 0, check.stderr[-2000:]


def test_a_report_asked_inside_the_bundle_is_refused_and_writes_nothing(gpt2):
    root = gpt2["root"]
    for target in ("gpt2/components/decode.report.html", "gpt2/r.html"):
        run = run_cli("report", "gpt2/components/decode", "-o", target, cwd=root)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert "inside the bundle" in run.stderr and target in run.stderr, run.stderr
        assert not (root / target).exists()


def test_the_exported_component_pages_name_the_model(gpt2):
    data = page_data(gpt2["bundle"] / "components" / "prefill" / "report.html")
    assert data["model_name"] == "gpt2" and data["component"] == "prefill"


def test_overwrite_replaces_a_bundle_that_was_reported_and_a_terminal_sees_each_graph(gpt2):
    """--overwrite replaces a bundle `report` ran on; on a terminal (a pty) the live line names the directory's
    config read, its load and each graph's stages."""
    import shlex
    import shutil

    root = gpt2["root"]
    assert run_cli("report", "gpt2", cwd=root).returncode == 0
    command = [sys.executable, "-m", "cann_export", "gpt2-dir", "-o", "gpt2", *TASK, "--overwrite", "--no-validate"]
    if shutil.which("script") is None:  # util-linux's script gives the pty
        run = run_cli(*command[3:], cwd=root)
        assert run.returncode == 0, run.stderr[-2000:]
        return
    log = root / "tty.txt"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    run = subprocess.run(["script", "-qfec", shlex.join(command), str(log)], cwd=root, env=env, capture_output=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-2000:]
    text = log.read_text(errors="replace")
    assert "\x1b[" in text and "read config.json (task, graphs)" in text and "load model directory" in text
    assert "[prefill 5/12] capture" in text and "[decode 5/12] capture" in text, text[-3000:]
