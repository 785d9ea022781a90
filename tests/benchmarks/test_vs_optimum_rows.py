"""bench_vs_optimum.py's sweep: a model a tool cannot export is a row with the reason (not a crash of the
benchmark), and the summary's family medians and targets are the ones issue 44 names."""
import argparse
import json
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_vs_optimum
        import vs_optimum_summary

        yield bench_vs_optimum, vs_optimum_summary
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_model_neither_tool_exports_is_a_row_with_each_reason(bench, tmp_path, capsys):
    bench_vs_optimum, summary = bench
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "bert"}))  # names no architecture
    failing_optimum = tmp_path / "optimum-cli"  # a tool that fails the way optimum-cli does: a message, exit 1
    failing_optimum.write_text("#!/bin/sh\necho 'ValueError: Unrecognized configuration class' >&2\nexit 1\n")
    failing_optimum.chmod(0o755)
    info = {"family": "text encoder", "task": "feature-extraction", "about": "no architectures", "inputs": {}}
    args = argparse.Namespace(repeat=1, shapes="default", timeout=300.0, keep_logs=tmp_path / "logs")
    args.keep_logs.mkdir()
    env = dict(os.environ, PYTHONPATH=str(BENCHMARKS.parent))

    row = bench_vs_optimum.bench("broken", info, tmp_path, failing_optimum, "dir", args, env, env)

    assert set(row["unavailable"]) == {"ours", "optimum", "novalidate"}
    assert row["unavailable"]["ours"].startswith("exit 2: ")
    assert "architectures" in row["unavailable"]["ours"]
    assert row["unavailable"]["optimum"] == "exit 1: ValueError: Unrecognized configuration class"
    assert row["ratios"] == {}
    assert sorted(p.name for p in args.keep_logs.iterdir()) == [
        "broken-optimum-0.log", "broken-ours-0.log", "broken-ours-novalidate-0.log"]
    result = summary.summary({"broken": row})
    assert result["overall"] == {"models": 0}
    assert not result["targets"]["median wall <= 1.0x"]["met"]  # nothing measured meets nothing
    summary.print_rows({"broken": row}, "title")
    assert "broken: optimum could not export it: exit 1: ValueError" in capsys.readouterr().out


def _runs(ours: tuple[float, float, float], optimum: tuple[float, float, float], novalidate: float) -> dict:
    """One round of each side: (wall s, CPU s, peak MiB); our side's stages and checks as the CLI prints them."""
    def side(wall: float, cpu: float, mib: float) -> dict:
        return {"wall_s": wall, "cpu_s": cpu, "peak_mib": mib, "rc": 0, "stages": {"capture": 1.0},
                "input_sets": 9, "checks_s": 2.0}

    return {"ours": [side(*ours)], "optimum": [side(*optimum)],
            "ours-novalidate": [side(novalidate, novalidate, ours[2])]}


def test_family_medians_and_the_targets_they_miss(bench):
    bench_vs_optimum, summary = bench
    rows = {}
    for name, family, ours, novalidate in (("a", "text encoder", (9.0, 9.0, 600.0), 7.0),
                                           ("b", "text encoder", (11.0, 11.0, 600.0), 7.0),
                                           ("c", "encoder-decoder", (40.0, 40.0, 1300.0), 30.0)):
        info = {"family": family, "task": "t", "about": name}
        rows[name] = bench_vs_optimum.row_of(info, "dir", _runs(ours, (10.0, 10.0, 1000.0), novalidate), {})

    assert rows["c"]["ratios"] == {"wall": 4.0, "cpu": 4.0, "rss": 1.3, "nv_wall": 3.0, "nv_cpu": 3.0, "nv_rss": 1.3}
    assert rows["c"]["checks_s"] == 2.0
    result = summary.summary(rows)
    assert result["families"]["text encoder"]["wall"] == 1.0
    assert result["families"]["text encoder"]["nv_wall"] == 0.7
    assert result["overall"]["wall"] == 1.1 and result["overall"]["models"] == 3
    targets = result["targets"]
    assert targets["no family's wall > 1.3x"] == {"met": False, "over": ["encoder-decoder 4.00x"]}
    assert targets["peak RSS <= 1.2x on every model"] == {"met": False, "over": ["c"]}
    assert targets["--no-validate median wall <= 0.8x"] == {"met": True, "value": 0.7}
    assert not targets["median CPU <= 1.0x"]["met"]


BUNDLE_LOG = """\
cann-export: gpt2 -> out/model (onnx)
read config.json (task, graphs) ... done (10.01s)
load model directory ... done (8.48s)
[prefill 2/12] prepare ... 8 input sets from example_inputs (5.97s)
[prefill 5/12] capture ... torchscript, opset 17 (38.84s)
[prefill 10/12] validate ... passed (12.61s)
[decode 2/12] prepare ... 10 input sets from example_inputs (3.83s)
[decode 5/12] capture ... torchscript, opset 17 (50.30s)
  prefill: parity passed (fp32 ok)
    checks: 18.6 s (parity sets, eager reference, onnxruntime runs); they raised the peak RSS by 34 MiB, to 2826 MiB
  decode: parity passed (fp32 ok)
    checks: 16.4 s (parity sets, eager reference, onnxruntime runs); they raised the peak RSS by 0 MiB, to 2879 MiB
"""


def test_a_bundles_stages_and_checks_are_summed_over_its_graphs(bench, tmp_path):
    """The CLI names each graph in a bundle's stage lines ("[decode 5/12] capture"): the sums and each graph's own."""
    bench_vs_optimum, _ = bench
    log = tmp_path / "gpt2-ours-0.log"
    log.write_text(BUNDLE_LOG)
    found = bench_vs_optimum.stages(log)
    assert found["capture"] == 89.14 and found["decode:capture"] == 50.3 and found["prefill:capture"] == 38.84
    assert found["read config.json (task, graphs)"] == 10.01 and found["load model directory"] == 8.48
    assert bench_vs_optimum.parity_sets(log) == 18
    assert bench_vs_optimum.checks_seconds(log, found) == 35.0
