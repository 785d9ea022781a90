"""The process that commits an export re-checks what the stages before commit staged (bundle/staged.py): the model's
code ran there (in the load sandbox's child, or in-process with --no-sandbox) and may have written into the staging
directory. The payload is a trusted pickle (helpers/staged_payload.py) that changes the staged artifact after the
format finalized it and re-hashes the file table, so the bundle agrees with itself; every change is refused at
commit, exit 2, nothing committed, no staging left. Without the check each of these exports exits 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cann_export import errors
from cann_export.bundle import format_writers as formats
from cann_export.cli.main import cli
from cann_export.sandbox import confine
from helpers.staged_payload import Plant
from helpers.toy_models import make_mlp

SANDBOXED = confine.probe().available
FUSION = ["--atc-hint", "fusion_switch=ConvToFullyConnectionFusionPass:off"]

CASES = [  # kind, format, extra args, what the refusal names
    ("extra", "atc_ready", [], "'p4-planted.sh'"),
    ("symlink", "atc_ready", [], "'passwd': a symbolic link"),
    ("convert", "atc_ready", [], "atc/convert.sh: differs"),
    ("cfg", "atc_ready", FUSION, "atc/fusion_switch.cfg: differs"),
    ("soc", "atc_ready", [], "atc.soc_version"),
    ("folder", "atc_ready", [], "'hooks'/: not a directory"),
    ("extra", "onnx", [], "'p4-planted.sh': not a file --format onnx writes"),
    ("symlink", "onnx", [], "'passwd': a symbolic link"),
    ("hardlink", "onnx", [], "'linked.onnx': a hard link"),
]


@pytest.fixture
def restored(monkeypatch):
    """An in-process (--no-sandbox) payload wraps the formats' finalize: put them back whatever happens."""
    for cls in (formats.OnnxFormat, formats.AtcReadyFormat):
        monkeypatch.setattr(cls, "finalize", cls.__dict__["finalize"])


def _export(tmp_path: Path, kind: str | None, fmt: str, extra: list[str], sandbox: bool) -> tuple[object, Path]:
    model = tmp_path / f"{kind or 'healthy'}.pth"
    torch.save(Plant(kind) if kind else make_mlp().eval(), str(model))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / ("m.onnx" if fmt == "onnx" else "bundle")
    args = [str(model), "-o", str(out), "--format", fmt, "--trust-pickle", "--input-shape", "x:2,12",
            *(["--json"] if kind is None else []), *extra, *([] if sandbox else ["--no-sandbox"])]
    return CliRunner().invoke(cli, args), out_dir


def _modes() -> list:
    return [pytest.param(True, id="sandboxed", marks=pytest.mark.skipif(not SANDBOXED, reason="no Landlock")),
            pytest.param(False, id="no-sandbox")]


@pytest.mark.parametrize("sandbox", _modes())
@pytest.mark.parametrize("kind,fmt,extra,named", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_what_the_model_code_planted_is_refused_at_commit(tmp_path, restored, sandbox, kind, fmt, extra, named):
    res, out_dir = _export(tmp_path, kind, fmt, extra, sandbox)
    assert res.exit_code == errors.EXIT_USER_ERROR, res.output
    assert "[commit]" in res.output and "does not write: " in res.output and named in res.output, res.output
    assert "Nothing was committed" in res.output and "Traceback" not in res.output
    if sandbox:
        assert "the sandboxed stages (landlock+seccomp)" in res.output
    assert list(out_dir.iterdir()) == []  # nothing committed beside the output either
    assert not [p for p in tmp_path.rglob("*") if ".cann-" in p.name]  # the staging is gone


@pytest.mark.parametrize("sandbox", _modes())
@pytest.mark.parametrize("fmt,extra", [("atc_ready", FUSION), ("onnx", [])])
def test_the_healthy_export_still_commits(tmp_path, sandbox, fmt, extra):
    res, out_dir = _export(tmp_path, None, fmt, extra, sandbox)
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["sandbox"]["kind"] == ("landlock+seccomp" if sandbox else "none")
    if fmt == "onnx":
        assert sorted(p.name for p in out_dir.iterdir()) == ["m.onnx"]
    else:
        manifest = json.loads((out_dir / "bundle" / "manifest.json").read_text())
        assert "atc/fusion_switch.cfg" in manifest["files"] and result["manifest_sha256"]


def test_declared_names_are_the_outputs_own_not_patterns():
    from cann_export.bundle.staged import matches

    ours = formats.OnnxFormat().writes(Path("out/m[1]*.onnx"))
    assert all(matches(name, ours) for name in ("m[1]*.onnx", "m[1]*.onnx.data", "m[1]*.weights.safetensors"))
    assert not matches("m1x.onnx", ours) and not matches("m[1]*.onnx.sh", ours)
    bundle = formats.AtcReadyFormat().writes(Path("b"))
    assert matches("atc/convert.sh", bundle) and matches("hf/tokenizer.json", bundle)
    assert not matches("atc/convert.sh.bak", bundle) and not matches("hf/extra.sh", bundle)
