"""Live progress: the API's events (a stage's start, countable work, end) reach ``on_progress`` and logging and
never stdout; the CLI's first line is out before the export starts, then one line per stage in a pipe, and a
live rich line on a terminal (a pty from util-linux's ``script``); events cross the load sandbox."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import cann_export
from cann_export.progress import ProgressEvent

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ["examples/tiny_cnn.safetensors", "--model-class", "examples.tiny_cnn:TinyCNN", "--input-shape",
           "x:1,3,32,32"]


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_api_reports_through_the_callback_and_logging_never_print(tmp_path, capsys, caplog):
    events: list[ProgressEvent] = []
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    with caplog.at_level(logging.INFO, logger="cann_export.progress"):
        cann_export.export(model, tmp_path / "b", example_inputs=(torch.randn(2, 8),), num_random_inputs=3,
                           on_progress=events.append)
    assert capsys.readouterr().out == ""
    starts = [e.stage for e in events if e.kind == "start"]
    ends = [e for e in events if e.kind == "end"]
    assert [e.index for e in ends] == list(range(1, len(ends) + 1)) and ends[0].stages == len(ends)
    assert starts and starts[0] == "load" and set(starts) <= {e.stage for e in ends}
    counted = [(e.stage, e.done, e.total) for e in events if e.kind == "advance" and e.what == "parity input sets"]
    assert counted and counted[-1][1] == counted[-1][2] == 4 and counted[0][0] == "validate", counted
    assert any(e.what == "emulated device sets" for e in events if e.kind == "advance")
    for e in events:  # an advance lies between its stage's start and end
        if e.kind == "advance":
            i = events.index(e)
            assert any(s.kind == "start" and s.stage == e.stage for s in events[:i])
            assert any(s.kind == "end" and s.stage == e.stage for s in events[i:])
    logged = [r.getMessage() for r in caplog.records if r.name == "cann_export.progress"]
    assert any(m.startswith("[5/12] capture ...") for m in logged), logged


def test_events_cross_the_load_sandbox(tmp_path):
    events: list[ProgressEvent] = []
    cann_export.export(ROOT / "examples/tiny_cnn.safetensors", tmp_path / "b", model_class="examples.tiny_cnn:TinyCNN",
                       input_shapes=["x:1,3,32,32"], on_progress=events.append)
    assert [e.stage for e in events if e.kind == "start"][0] == "load"
    assert any(e.kind == "advance" and e.what == "parity input sets" for e in events)


def test_a_malformed_event_is_refused():
    for bad in ({"kind": "explode"}, {"kind": "end", "index": "1"}, {"kind": "end", "done": True}, []):
        with pytest.raises(ValueError):
            ProgressEvent.from_dict(bad)
    long = ProgressEvent.from_dict({"kind": "end", "stage": "x" * 1000})
    assert len(long.stage) == 200


def test_cli_in_a_pipe_prints_a_first_line_then_one_line_per_stage(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cann_export", *EXAMPLE, "-o", str(tmp_path / "b"), "--json"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("[", "cann-export:"))]
    assert lines[0].startswith("cann-export: examples/tiny_cnn.safetensors -> ")
    stages = [ln for ln in lines if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in stages] == [f"[{k}/12" for k in range(1, 13)], stages
    assert "\x1b[" not in r.stderr  # no terminal drawing in a pipe
    json.loads(r.stdout)  # --json: stdout stays one JSON object
    # torch.export's log notes (a batch of 1 specialised) are kept in the manifest, not shown between the stages
    assert "non_strict_utils" not in r.stderr, r.stderr
    heard = json.loads((tmp_path / "b" / "manifest.json").read_text())["warnings"]["third_party"]
    assert any("torch._export" in h and "specialized" in h for h in heard), heard


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux's script (a pty) is not installed")
def test_cli_on_a_terminal_draws_a_live_line(tmp_path):
    log = tmp_path / "tty.txt"
    command = " ".join([sys.executable, "-m", "cann_export", *EXAMPLE, "-o", str(tmp_path / "b")])
    r = subprocess.run(["script", "-qfec", command, str(log)], cwd=ROOT, env=_env(), capture_output=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:]
    text = log.read_text(errors="replace")
    assert "\x1b[" in text and "[5/12] capture" in text and "[10/12] validate ... passed" in text
