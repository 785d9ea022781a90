"""A dynamic single graph's parity shapes under the element budget (inputs/shape_budget.py): a batch range end whose
set holds feature maps past the budget runs at the largest batch within it (its middle following), the sizes left
out are recorded in parity.shape_budget, validate re-derives them from the graph and refuses an edited record, and
``parity_full_ranges`` runs every end. The exports are in the slow set; the points' arithmetic, which validate shares,
is checked cheaply here."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import cann_export
from cann_export.errors import ValidateError
from cann_export.inputs import parity_budget

CHANNELS, SIDE = 64, 128  # one row's first feature map: 64 x 128 x 128 = 1 M elements, 2 alive at once


class Wide(torch.nn.Module):
    """A conv whose output (batch x 64 x 128 x 128) is 22x its input: the inputs alone fit the budget at batch 16."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, CHANNELS, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    work = tmp_path_factory.mktemp("budget")
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    exported = torch.export.export(Wide().eval(), (torch.randn(2, 3, SIDE, SIDE),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(exported, str(work / "wide.pt2"))
    return work


@pytest.fixture(scope="module")
def bounded(program):
    result = cann_export.export(str(program / "wide.pt2"), program / "bounded", sandbox="off")
    assert result.ok
    return program / "bounded"


def test_a_range_end_past_the_budget_gives_way_to_the_largest_size_within_it():
    """The points parity runs at (and validate expects): batch 1..16 with one row's 2 x 1 M elements of feature
    maps against the 2^24 floor: 1, 4 and 7, the ends 8 and 16 recorded as left out; no budget: 1, 8, 16."""
    from cann_export.dynamic import DynamicAxis
    from cann_export.inputs.dynamic_axes import points_from
    from cann_export.inputs.shape_budget import set_elements

    axes = [DynamicAxis("x", 0, "batch", 1, 16)]
    terms = [{"elements": 2 * CHANNELS * SIDE * SIDE, "exponents": {"batch": 1}}]  # at the example's batch of 2
    elements = set_elements([["batch", 3, SIDE, SIDE]], terms, {"batch": 2})
    left: list = []
    points = points_from(axes, {"batch": 2}, False, None, False, (parity_budget.FLOOR, elements), left)
    assert [p["batch"] for p in points] == [1, 4, 7]
    assert sorted(g["size"] for g in left) == [8, 16]
    assert [p["batch"] for p in points_from(axes, {"batch": 2}, False)] == [1, 8, 16]


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


@pytest.mark.slow
def test_the_batch_range_end_runs_at_the_largest_batch_within_the_budget(bounded):
    parity = _manifest(bounded)["parity"]
    batches = [s["shape"]["batch"] for s in parity["shapes"]]
    record = parity["shape_budget"]
    cap = batches[-1]
    assert batches[:2] == [2, 1] and batches == [2, 1, (1 + cap) // 2, cap] and 1 < cap < 16, batches
    one_row = parity_budget.LIVE * CHANNELS * SIDE * SIDE + 3 * SIDE * SIDE  # its feature maps and its input
    assert cap * one_row <= record["elements"] < (cap + 1) * one_row
    assert sorted(g["size"] for g in record["left_out"]) == [8, 16]
    assert all("--parity-full-ranges" in g["reason"] for g in record["left_out"])
    assert record["activations"] and record["activations"][0]["exponents"] == {"batch": 1}
    assert all(s["passed"] for s in parity["shapes"])
    assert any(w.startswith("batch=16: ") for w in _manifest(bounded)["warnings"]["dynamic"])


@pytest.mark.slow
def test_validate_rederives_the_bounded_shapes_and_refuses_an_edited_record(bounded, tmp_path):
    assert cann_export.validate(bounded)["passed"]
    for edit, match in [(lambda p: p["shape_budget"]["left_out"].pop(), "parity.shape_budget.left_out"),
                        (lambda p: p.pop("shape_budget"), "parity.shapes"),
                        (lambda p: p["shape_budget"].update(elements=1 << 26), "parity.shape_budget.elements")]:
        copy = tmp_path / f"edited{len(list(tmp_path.iterdir()))}"
        shutil.copytree(bounded, copy)
        manifest = _manifest(copy)
        edit(manifest["parity"])
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ValidateError, match=match):
            cann_export.validate(copy)


@pytest.mark.slow
def test_parity_full_ranges_runs_every_range_end(program):
    result = cann_export.export(str(program / "wide.pt2"), program / "full", sandbox="off", parity_full_ranges=True)
    assert result.ok
    parity = _manifest(program / "full")["parity"]
    assert [s["shape"]["batch"] for s in parity["shapes"]] == [2, 1, 8, 16]
    assert "shape_budget" not in parity
