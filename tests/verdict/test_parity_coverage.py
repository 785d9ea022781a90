"""What parity covered against what ATC will build, said where the verdict is read: with gears ATC builds every
combination of the axes' gears while parity (by default) runs each axis at its gears with the others at the example's
size; with ranges ATC accepts every size while parity runs each axis's ends and middle. The export's verdict line and
`inspect` say how many of ATC's profiles (the ranges' end combinations) parity ran at, and `--parity full` runs them
all (validate re-derives the same shapes from the manifest)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

GEARS = "x:0=batch:1,2,4,1=seq:8,16"  # 3 x 2 = 6 ATC profiles
RANGES = "x:0=batch:1..64,1=seq:2..512"


def run_cli(*args: object, cwd: Path) -> SimpleNamespace:
    """The CLI in this process (the export's sandbox child still forks): a subprocess per call paid torch's import
    again, a quarter of this file's time. tests/cli/test_cli.py keeps the real subprocess entry point covered."""
    from click.testing import CliRunner

    from cann_export.cli.main import cli

    with contextlib.chdir(cwd):
        result = CliRunner().invoke(cli, [str(a) for a in args])
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


@pytest.fixture(scope="session")
def program(tmp_path_factory) -> Path:
    """A torch.export program with a dynamic batch and sequence (Linear over the features, summed over the
    sequence), example x [2, 8, 16]."""
    import torch
    from torch import nn
    from torch.export import Dim

    class Pool(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 8)

        def forward(self, x):
            return torch.tanh(self.fc(x)).sum(1)

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("coverage")
    dims = {"x": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=512)}}
    exported = torch.export.export(Pool().eval(), (torch.randn(2, 8, 16),), dynamic_shapes=dims)
    torch.export.save(exported, str(root / "pool.pt2"))
    return root


@pytest.fixture(scope="session")
def exports(program) -> dict:
    """The program exported with gears and with ranges, each by default and with --parity full: {name: stdout}."""
    out = {}
    for name, dynamic, extra in (("gears", GEARS, []), ("gears_full", GEARS, ["--parity", "full"]),
                                 ("ranges", RANGES, []), ("ranges_full", RANGES, ["--parity", "full"])):
        run = run_cli("pool.pt2", "-o", name, "--dynamic", dynamic, *extra, cwd=program)
        assert run.returncode == 0, run.stderr[-3000:]
        out[name] = run.stdout
    return out


def _manifest(program: Path, name: str) -> dict:
    return json.loads((program / name / "manifest.json").read_text())


def test_the_verdict_line_says_how_many_atc_profiles_parity_covered(exports):
    line = next(ln for ln in exports["gears"].splitlines() if ln.startswith("parity:"))
    assert line.startswith("parity: passed on 4 of 6 ATC profiles (each axis at its gears, the others at the "
                           "example's size) [--parity full checks all 6]"), line
    line = next(ln for ln in exports["ranges"].splitlines() if ln.startswith("parity:"))
    assert "on 0 of 4 combinations of the ATC ranges' ends" in line and "--parity full checks all 4" in line, line


def test_parity_full_runs_every_profile_and_validate_rederives_it(exports, program):
    line = next(ln for ln in exports["gears_full"].splitlines() if ln.startswith("parity:"))
    assert line.startswith("parity: passed on 6 of 6 ATC profiles (every combination)") and "--parity" not in line
    shapes = [r["shape"] for r in _manifest(program, "gears_full")["parity"]["shapes"]]
    assert sorted(map(lambda s: (s["batch"], s["seq"]), shapes)) == [(1, 8), (1, 16), (2, 8), (2, 16), (4, 8), (4, 16)]
    assert _manifest(program, "gears_full")["parity"]["coverage"] == "full"
    ranges = [r["shape"] for r in _manifest(program, "ranges_full")["parity"]["shapes"]]
    assert all({"batch": b, "seq": s} in ranges for b in (1, 64) for s in (2, 512))
    for name in ("gears_full", "ranges_full", "gears"):
        check = run_cli("validate", name, cwd=program)
        assert check.returncode == 0, check.stderr[-2000:]


def test_a_manifest_claiming_full_coverage_it_did_not_run_is_refused(exports, program, tmp_path):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(program / "gears", edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["parity"]["coverage"] = "full"
    (edited / "manifest.json").write_text(json.dumps(manifest))
    check = run_cli("validate", edited, cwd=tmp_path)
    assert check.returncode != 0 and "parity.shapes" in check.stderr, check.stderr[-2000:]


def test_inspect_says_what_parity_covered(exports, program):
    shown = run_cli("inspect", "gears", cwd=program)
    assert shown.returncode == 0, shown.stderr
    assert "covers 4 of 6 ATC profiles (each axis at its gears, the others at the example's size) [--parity full " \
           "checks all 6]" in shown.stdout, shown.stdout
    data = json.loads(run_cli("inspect", "gears_full", "--json", cwd=program).stdout)
    assert data["coverage"]["profiles"] == data["coverage"]["covered"] == 6 and data["coverage"]["mode"] == "full"


def test_coverage_of_a_budget_capped_range_names_how_far_parity_checked():
    from cann_export.bundle import coverage

    manifest = {"parity": {"validated": True, "shapes": [{"shape": {"batch": 2}}, {"shape": {"batch": 1}},
                                                         {"shape": {"batch": 25}}, {"shape": {"batch": 49}}]},
                "atc": {"dynamic": {"form": "input_shape", "axes": [{"name": "batch", "min": 1, "max": 64}]}}}
    found = coverage.of(manifest)
    assert found["axes"]["batch"] == {"built": [1, 64], "checked": [1, 49]}
    assert coverage.sentence(found).endswith("; batch checked to 49 of 64")
    assert coverage.hint(found) == "--parity full checks all 2 and past the element budget"
    assert coverage.of({"parity": {"validated": True}, "atc": {}}) is None  # no dynamic axes: nothing to say


def test_a_bad_parity_option_is_refused(program):
    run = run_cli("pool.pt2", "-o", "x", "--parity", "most", cwd=program)
    assert run.returncode == 2 and "--parity" in run.stderr and not (program / "x").exists(), run.stderr


@pytest.mark.slow  # a GPT-2 with past at --parity full: with the multi-graph exports of tests/multigraph/
def test_a_multi_graph_export_says_and_runs_its_coverage(tmp_path):
    """A tiny GPT-2 with past: each component's verdict line says what parity covered of its ATC ranges;
    --parity full runs every combination of the range ends (past the element budget) and validate re-derives it."""
    from helpers.hf_models import tiny_decoder_gpt2

    tiny_decoder_gpt2(n_positions=32).save_pretrained(tmp_path / "gpt2-dir")
    run = run_cli("gpt2-dir", "-o", "gpt2", "--task", "text-generation-with-past", "--parity", "full", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("prefill", "decode"):
        assert f"  {name}: parity passed on 4 of 4 combinations of the ATC ranges' ends (every combination of the " \
               "ends)" in run.stdout, run.stdout
        shapes = [r["shape"] for r in _manifest(tmp_path / "gpt2" / "components", name)["parity"]["shapes"]]
        assert len(shapes) == len({json.dumps(s, sort_keys=True) for s in shapes}) > 7  # the 7 default, then corners
    check = run_cli("validate", "gpt2", cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-2000:]
    shown = run_cli("inspect", "gpt2", cwd=tmp_path).stdout
    assert shown.count("covers 4 of 4 combinations of the ATC ranges' ends") == 2, shown
