"""The README's quickstarts, run exactly as written: each code block after a ``<!-- quickstart: LANG -->``
comment runs in a fresh directory holding a copy of ``examples/`` (bash blocks through bash with ``set -e``,
python blocks through python), in the environment the tests run in, with nothing added to it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- quickstart: (bash|python) -->\s*```(?:bash|python)\n(.*?)```", re.S)


def quickstarts() -> list[tuple[str, str]]:
    return MARKER.findall((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_has_the_three_quickstarts():
    blocks = quickstarts()
    assert [lang for lang, _ in blocks] == ["bash", "bash", "python"]
    assert "examples/tiny-bert" in blocks[1][1]
    assert "cann.torch.export(" in blocks[2][1]


@pytest.mark.parametrize("index", range(3), ids=["model-file", "hf-directory", "python-api"])
def test_a_readme_quickstart_runs_as_written(index, tmp_path):
    lang, code = quickstarts()[index]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {key: value for key, value in os.environ.items() if key != "CANN_EXPORT_DEBUG"}
    command = ["bash", "-e", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    expected = {0: {"cnn_bundle"}, 1: {"tiny-bert.onnx", "tiny-bert_atc_ready"}, 2: {"api_bundle", "api_bundle.pth"}}
    assert expected[index] <= set(written), written
    assert "Traceback" not in done.stderr
