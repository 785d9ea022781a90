"""Behaviour unchanged by the bundle/rooms refactor (issue 42): a single-graph (tiny GPT-2, onnx and atc_ready)
and a multi-graph (tiny GPT-2 with past, tiny T5) export through the CLI write the same manifest.json,
parity.json and ``--json`` output as the code before it, byte for byte after normalising only what differs run
to run (see helpers/golden_bundles.py: the tmp path, created_utc, stage_seconds, sha256 values, the size of a
manifest.json or model.onnx in a file table). Regenerate on purpose only, with the helper's write_goldens."""
from __future__ import annotations

import pytest

from helpers import golden_bundles


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return golden_bundles.run_cases(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("case", sorted(golden_bundles.CASES))
def test_export_outputs_equal_the_golden(exported, case):
    golden = golden_bundles.read_golden(case)
    assert sorted(exported[case]) == sorted(golden)
    for name, text in golden.items():
        assert exported[case][name] == text, f"{case}/{name} differs from its golden"


def test_the_normalising_keeps_what_must_not_change():
    text = '{"stage_seconds": {"load": 0.5}, "created_utc": "x", "opset": 17, "sha256": "' + "a" * 64 + '"}'
    out = golden_bundles.normalise(text, "/nowhere")
    assert out == '{"stage_seconds": {"load": <s>}, "created_utc": "<t>", "opset": 17, "sha256": "<sha>"}'
    assert golden_bundles.normalise(text.replace("17", "18"), "/nowhere") != out
