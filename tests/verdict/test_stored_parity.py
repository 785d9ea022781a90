"""The parity data a bundle stores for `validate` is capped (--stored-parity-mib): every set at the example's
shape is kept, other shapes whole while they fit (a failed export keeps all); the manifest's parity.stored names
the shapes left out, and validate re-derives the rest and says so. (A decoder's reference logits at its range
ends were most of the bundle: GPT-2's prefill stored 455 MB beside 500 MB of weights.)"""
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import cann_export
from cann_export.bundle.parity_store import chosen_sets
from cann_export.cli.main import cli
from cann_export.errors import ValidateError


class ShapeOnly(torch.nn.Module):
    """A second output that depends only on the batch size: constant at any one shape."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x), torch.ones_like(x[:, :1, 0, 0]) * x.shape[0]


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A .pt2 with a dynamic batch (1..16): parity runs at batch 2 (the example) and at 1, 8 and 16."""
    work = tmp_path_factory.mktemp("stored")
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = torch.export.export(Conv().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(prog, str(work / "conv.pt2"))
    return work


@pytest.fixture(scope="module")
def capped(program):
    """Exported with --stored-parity-mib 0: only the example's shape is stored."""
    run = CliRunner().invoke(cli, [str(program / "conv.pt2"), "-o", str(program / "capped"), "--no-sandbox",
                                   "--stored-parity-mib", "0"])
    assert run.exit_code == 0, run.output
    return program / "capped"


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_the_cap_keeps_the_example_shape_and_names_what_it_left_out(capped):
    parity = _manifest(capped)["parity"]
    stored = parity["stored"]
    assert [g["shape"] for g in stored["left_out"]] == [{"batch": 1}, {"batch": 8}, {"batch": 16}]
    assert stored["cap_mib"] == 0 and stored["of"] == parity["input_sets"] == 8
    # every set at the example's shape (batch 2): its verdict sets and the specialisation probes
    assert stored["input_sets"] == [0, 1, 2, 3, 4] and parity["shapes"][0]["input_sets"] == [0, 1, 2]
    assert all(g["bytes"] > 0 for g in stored["left_out"])
    assert [s["shape"] for s in parity["shapes"]] == [{"batch": 2}, {"batch": 1}, {"batch": 8}, {"batch": 16}]
    assert json.loads((capped / "parity.json").read_text())["stored"] == stored
    shown = CliRunner().invoke(cli, ["inspect", str(capped)])
    assert "the bundle stores 5 of them (--stored-parity-mib 0)" in " ".join(shown.output.split()), shown.output


def test_validate_rederives_the_stored_sets_and_says_what_it_could_not(capped, tmp_path):
    report = cann_export.validate(capped)
    assert report["passed"] and report["input_sets"] == len(report["stored"]["input_sets"]) == 5
    recorded = _manifest(capped)["parity"]["shapes"]
    # every shape's row, in the export's numbering; the left-out ones are the manifest's, marked
    assert [(r["shape"], r["input_sets"], r.get("rederived", True)) for r in report["shapes"]] == [
        (r["shape"], r["input_sets"], r["shape"] == {"batch": 2}) for r in recorded]
    run = CliRunner().invoke(cli, ["validate", str(capped), "--junit", str(tmp_path / "j.xml")])
    assert run.exit_code == 0, run.output
    assert "re-derived on 5 of 8 input sets" in run.output and "batch=16" in run.output
    junit = (tmp_path / "j.xml").read_text()
    assert 'skipped="3"' in junit and "not re-derived: the bundle did not store" in junit


def test_by_default_a_small_model_stores_every_set(program):
    result = cann_export.export(str(program / "conv.pt2"), program / "full", sandbox="off")
    assert result.ok
    parity = _manifest(program / "full")["parity"]
    assert "stored" not in parity
    assert cann_export.validate(program / "full")["input_sets"] == parity["input_sets"] == 8


def test_a_manifest_that_hides_the_cap_is_refused(capped, tmp_path):
    """Without parity.stored the stored data must hold every shape the manifest claims."""
    copy = tmp_path / "hidden"
    shutil.copytree(capped, copy)
    manifest = _manifest(copy)
    del manifest["parity"]["stored"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValidateError, match="parity.shapes"):
        cann_export.validate(copy)


def _fail_batch_16(parity):
    parity["shapes"][3].update(fp32=False, device=False, passed=False)


def _hostile_dim(parity):
    parity["stored"]["left_out"][0]["shape"] = {"\x1b]0;x\x07evil\nok FAKE": 1}


def _swap_left_sets(parity):
    left = parity["stored"]["left_out"]
    left[0]["input_sets"], left[1]["input_sets"] = left[1]["input_sets"], left[0]["input_sets"]


@pytest.mark.parametrize("edit, words", [
    (lambda p: p["stored"].update(input_sets=p["stored"]["input_sets"][:2]), "the parity data holds 5"),
    (lambda p: p["stored"].update(left_out="everything"), "parity.stored is malformed"),
    (lambda p: p["stored"].update(of=7), "does not account once for each of the 8"),
    (lambda p: p["stored"]["left_out"][0].update(input_sets=[6]), "does not account once"),
    (_fail_batch_16, "leaves out a shape that did not pass"),
    (_hostile_dim, "malformed left-out shape"),
    (lambda p: p["stored"].update(input_sets=p["stored"]["input_sets"][::-1]), "parity.stored is malformed"),
    (lambda p: p["stored"].update(cap_mib=None), "parity.stored is malformed"),
    (_swap_left_sets, "other input sets than"),
    (lambda p: p["shapes"][3].update(device=False), "leaves out a shape that did not pass"),
])
def test_a_manifest_whose_stored_sets_disagree_is_refused(capped, tmp_path, edit, words):
    copy = tmp_path / "edited"
    shutil.copytree(capped, copy)
    manifest = _manifest(copy)
    edit(manifest["parity"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValidateError, match=words) as e:
        cann_export.validate(copy)
    assert e.value.exit_code == 2


def test_an_output_constant_at_the_example_shape_keeps_every_set(tmp_path):
    """Left out, the other shapes would make parity's reference check see a constant output on validate."""
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = torch.export.export(ShapeOnly().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(prog, str(tmp_path / "m.pt2"))
    result = cann_export.export(str(tmp_path / "m.pt2"), tmp_path / "b", sandbox="off", stored_parity_mib=0)
    assert result.ok
    assert "stored" not in _manifest(tmp_path / "b")["parity"]
    assert cann_export.validate(tmp_path / "b")["passed"]


def test_a_quantized_graph_rederives_on_the_example_shape_alone(tmp_path):
    """A Q/DQ graph's shape rows are fp32 only: the re-derived example row is too."""
    import torchao.quantization.pt2e.quantize_pt2e as pt2e  # a declared test dependency: never skipped
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    exported = torch.export.export(Conv().eval(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b", max=16)}})
    prepared = pt2e.prepare_pt2e(exported.module(), X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config()))
    for _ in range(4):
        prepared(torch.randn(4, 3, 8, 8))
    result = cann_export.export(pt2e.convert_pt2e(prepared), tmp_path / "q", example_inputs=(x,),
                                dynamic="x:0=batch:1..16", stored_parity_mib=0, sandbox="off", lint="warn")
    assert result.ok and "quantization" in result.manifest
    assert [g["shape"] for g in _manifest(tmp_path / "q")["parity"]["stored"]["left_out"]] == [
        {"batch": 1}, {"batch": 8}, {"batch": 16}]
    assert cann_export.validate(tmp_path / "q")["passed"]


@pytest.mark.parametrize("value, words", [("-3", "not a whole number of MiB"), ("lots", "not a whole number"),
                                          ("\u00b2", "not a whole number")])
def test_a_bad_cap_is_an_options_error(program, tmp_path, value, words):
    run = CliRunner().invoke(cli, [str(program / "conv.pt2"), "-o", str(tmp_path / "b"), "--stored-parity-mib", value])
    assert run.exit_code == 2 and words in run.output
    assert not (tmp_path / "b").exists()


def _ctx(shapes, passed, nbytes):
    """The part of an export context chosen_sets reads: one set per shape of ``nbytes[i]`` output bytes."""
    sets = [{"x": torch.zeros(1)} for _ in shapes]
    return SimpleNamespace(
        input_sets=sets, reference_outputs=[[np.arange(n // 4, dtype=np.float32)] for n in nbytes],
        float_reference_outputs=[], input_set_labels=[{"role": "verdict", "shape": s} for s in shapes],
        reports=SimpleNamespace(parity=SimpleNamespace(passed=passed)))


def test_other_shapes_fill_the_cap_smallest_first_and_a_failed_export_keeps_all():
    shapes = [{"b": 2}, {"b": 1}, {"b": 8}, {"b": 16}, {"b": 64}]
    nbytes = [400, 200, 1600, 3200, 12800]
    kept, left = chosen_sets(_ctx(shapes, True, nbytes), 2000)
    assert kept == [0, 1, 2]  # the example (beyond the cap), then batch 1 and 8 within 2000 bytes
    assert [(g["shape"], g["input_sets"]) for g in left] == [({"b": 16}, [3]), ({"b": 64}, [4])]
    assert chosen_sets(_ctx(shapes, True, nbytes), None) == ([0, 1, 2, 3, 4], [])
    assert chosen_sets(_ctx(shapes, False, nbytes), 2000) == ([0, 1, 2, 3, 4], [])


def _shape_cells(page: str) -> dict[str, str]:
    """report.html's per-shape table: the shape's text -> its 'input sets in the bundle' cell."""
    import html
    import re

    table = page.split('<table id="shapes">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td><code>(.*?)</code></td>(?:<td>.*?</td>){2}<td>(.*?)</td></tr>", table)
    return {html.unescape(shape): re.sub("<[^>]+>", "", cell) for shape, cell in rows}


def test_report_html_marks_the_shapes_it_did_not_store(capped, tmp_path):
    exported = _shape_cells((capped / "report.html").read_text())
    from cann_export.report.write_report import regenerate  # what `cann-export report` runs

    assert regenerate(capped, tmp_path / "again.html")["passed"]
    for cells in (exported, _shape_cells((tmp_path / "again.html").read_text())):
        assert cells["batch 2"] == "stored"
        for batch in (1, 8, 16):
            assert cells[f"batch {batch}"].startswith("not stored (past --stored-parity-mib)"), cells


class Wide(torch.nn.Module):
    """A tiny model (one 3x3 conv, a few hundred bytes of weights) on large inputs: 3 x 224 x 224 images."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))


def test_by_default_a_tiny_models_bundle_stays_a_few_mib_and_validates(tmp_path):
    """The default cap ("auto") follows the graph's size (within 2..64 MiB), the example's own shape included: set
    0 is always stored, its other sets and the other shapes while they fit. Before, every set at the example's
    shape and 64 MiB of the others were stored: ~38 MiB of images beside a 1 KB graph."""
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = torch.export.export(Wide().eval(), (torch.randn(2, 3, 224, 224),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(prog, str(tmp_path / "w.pt2"))
    run = CliRunner().invoke(cli, [str(tmp_path / "w.pt2"), "-o", str(tmp_path / "b"), "--no-sandbox"])
    assert run.exit_code == 0, run.output
    parity_bytes = sum(p.stat().st_size for p in (tmp_path / "b" / "parity").iterdir())
    assert parity_bytes < 3 << 20, parity_bytes
    stored = _manifest(tmp_path / "b")["parity"]["stored"]
    assert 0 in stored["input_sets"] and stored["cap_mib"] == 2
    partial = [g for g in stored["left_out"] if g.get("partial")]
    assert len(partial) == 1 and partial[0]["shape"] == {"batch": 2}
    run = CliRunner().invoke(cli, ["validate", str(tmp_path / "b")])
    assert run.exit_code == 0, run.output
    assert "its other" in run.output


def test_an_explicit_cap_still_keeps_every_set_at_the_examples_shape():
    shapes = [{"b": 2}, {"b": 2}, {"b": 1}, {"b": 8}]
    nbytes = [400, 400, 200, 1600]
    kept, left = chosen_sets(_ctx(shapes, True, nbytes), 0)
    assert kept == [0, 1] and [g["input_sets"] for g in left] == [[2], [3]]  # each set also holds 4 input bytes
    kept, left = chosen_sets(_ctx(shapes, True, nbytes), 300, example_counts=True)
    assert kept == [0]  # the example itself, past the cap, which it counts against: nothing else fits
    assert left[0] == {"shape": {"b": 2}, "input_sets": [1], "bytes": 404, "partial": True}
    kept, left = chosen_sets(_ctx(shapes, True, nbytes), 700, example_counts=True)
    assert kept == [0, 2]  # 404 of the example, then batch 1's 204 fits; the example's second set does not


@pytest.mark.parametrize("edit, words", [
    (lambda p: p["stored"]["left_out"].append(dict(p["stored"]["left_out"][0])), "account once"),
    (lambda p: [g.update({"partial": True}) for g in p["stored"]["left_out"] if not g.get("partial")],
     "more than the example"),
    (lambda p: [g.update({"partial": "yes"}) for g in p["stored"]["left_out"]], "malformed left-out shape"),
])
def test_a_forged_partial_record_is_refused(tmp_path, edit, words):
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = torch.export.export(Wide().eval(), (torch.randn(2, 3, 224, 224),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(prog, str(tmp_path / "w.pt2"))
    assert cann_export.export(str(tmp_path / "w.pt2"), tmp_path / "b", sandbox="off").ok
    manifest = _manifest(tmp_path / "b")
    edit(manifest["parity"])
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValidateError, match=words):
        cann_export.validate(tmp_path / "b")
