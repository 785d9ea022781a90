"""Issue 21 item 3: `cann-export inspect` reads as text by default (graph, target, ATC command and cfg files, lint,
the verdict per output, notes) for a bundle directory, a single-file bundle, an om-stub and a plain .onnx file;
--json prints the whole object. Every value shown is checked against the bundle's manifest."""
from __future__ import annotations

import json
import shlex

import pytest
import torch
from click.testing import CliRunner
from helpers import calibration_models as cm

from cann_export import api
from cann_export.cli.main import cli


def invoke(args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return result


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One tiny model exported as a bundle directory, a single-file bundle and an om-stub (no atc on PATH),
    and the overflowing model exported with --fix-precision (a keep_dtype.cfg) and without (a failure)."""
    work = tmp_path_factory.mktemp("inspect")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    path = work / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 12),)), str(path))
    invoke([path, "-o", work / "bundle"])
    invoke([path, "-o", work / "mlp.pth"])
    invoke([path, "-f", "om", "-o", work / "mlp.om"])
    overflow, inputs, _ = cm.reduction_overflow()
    big = work / "overflow.pt2"
    torch.export.save(torch.export.export(overflow, (inputs["x"],)), str(big))
    invoke([big, "-o", work / "broken"])
    invoke([big, "-o", work / "fixed", "--fix-precision"])
    return work


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _check_common(text, manifest):
    model, atc = manifest["model"], manifest["atc"]
    assert f"graph: opset {model['opset']}" in text and f"{model['exporter']} exporter" in text
    for v in model["inputs"] + model["outputs"]:
        assert any({v["name"], v["dtype"]} <= set(line.split()) and line.endswith(f" {v['shape']}")
                   for line in text.splitlines()), v
    top = sorted(model["ops"].items(), key=lambda kv: -kv[1])
    assert "top ops: " + ", ".join(f"{k} x{n}" for k, n in top[:8]) in text
    assert f"target: {atc['soc_version']} (saturation overflow), precision mode {atc['precision_mode']}" in text
    assert "ATC command (atc/convert.sh): " + " ".join(shlex.quote(a) for a in atc["command"]) in text
    lint = manifest["lint"]["atc-lint"]
    assert f"lint atc-lint for CANN {lint['cann_version']}: passed, {len(lint['findings'])} finding(s)" in text
    parity = manifest["parity"]
    for o, d in zip(parity["fp32"]["outputs"], parity["device"]["outputs"], strict=True):
        fp32 = next(line for line in text.splitlines() if line.strip().startswith("fp32 "))
        mode = parity["device"]["mode"]
        device = next(line for line in text.splitlines() if line.strip().startswith(f"device {mode}"))
        assert f"cosine {o['cosine']:.6f}  max abs {o['max_abs']:.3g}  max rel {o['max_rel']:.3g}" in fp32
        assert f"cosine {d['cosine']:.6f}  max abs {d['max_abs']:.3g}  max rel {d['max_rel']:.3g}" in device
        assert (("ok" if o["passed"] else "FAIL") in fp32.split()) and (("ok" if d["passed"] else "FAIL") in device)


def test_a_bundle_directory_reads_as_text(exported):
    bundle = exported / "bundle"
    manifest = _manifest(bundle)
    text = invoke(["inspect", bundle]).stdout
    assert not text.lstrip().startswith("{")
    size = (bundle / "manifest.json").stat().st_size + sum(f["size"] for f in manifest["files"].values())
    files = len(manifest["files"])
    assert text.splitlines()[0] == f"{bundle} (atc_ready bundle; {files} files, {size / 1024:.1f} KiB on disk)"
    _check_common(text, manifest)
    assert "parity recorded at export: passed" in text


def test_json_keeps_the_whole_object(exported):
    bundle = exported / "bundle"
    payload = json.loads(invoke(["inspect", bundle, "--json"]).stdout)
    assert payload == json.loads(api.to_json(api.inspect(bundle)))
    manifest = _manifest(bundle)
    assert payload["lint"] == manifest["lint"] and payload["atc"]["command"] == manifest["atc"]["command"]
    assert payload["parity"] == manifest["parity"] and payload["size_bytes"] > 0


def test_a_single_file_bundle_and_an_om_stub_read_as_text(exported):
    archive = invoke(["inspect", exported / "mlp.pth"]).stdout
    assert "(atc_ready bundle, single-file archive;" in archive.splitlines()[0]
    assert f"{(exported / 'mlp.pth').stat().st_size / 1024:.1f} KiB on disk" in archive.splitlines()[0]
    stub = invoke(["inspect", exported / "mlp.om"]).stdout
    assert "om-stub" in stub.splitlines()[0] and "model.om: stub (no `atc` on PATH)" in stub
    assert "notes:\n  - om-stub (not a compiled model" in stub
    for text in (archive, stub):
        assert "parity recorded at export: passed" in text and "ATC command (atc/convert.sh): atc " in text


def test_a_failed_verdict_shows_the_failing_output_and_the_first_divergence(exported):
    manifest = _manifest(exported / "broken")
    text = invoke(["inspect", exported / "broken"]).stdout
    _check_common(text, manifest)
    assert "parity recorded at export: FAILED" in text
    assert manifest["parity"]["first_divergence"]["message"] in text


def test_keep_dtype_cfg_is_listed_with_its_nodes(exported):
    manifest = _manifest(exported / "fixed")
    text = invoke(["inspect", exported / "fixed"]).stdout
    nodes = (exported / "fixed" / "atc" / "keep_dtype.cfg").read_text().split()
    assert nodes and "--keep_dtype=atc/keep_dtype.cfg" in " ".join(manifest["atc"]["command"])
    assert f"atc/keep_dtype.cfg: {len(nodes)} entries: {', '.join(nodes[:6])}" in text
    assert f"kept in fp32 by --fix-precision: {len(manifest['parity']['fixed_by_keep_dtype'])} ops" in text


def test_a_plain_onnx_file_reads_as_text(exported):
    path = exported / "bundle" / "model.onnx"
    text = invoke(["inspect", path]).stdout
    assert text.splitlines()[0] == (f"{path} (plain ONNX file (no manifest: no recorded verdict); "
                                    f"{path.stat().st_size / 1024:.1f} KiB on disk)")
    assert "inputs:" in text and "top ops:" in text and "parity" not in text and "target:" not in text
