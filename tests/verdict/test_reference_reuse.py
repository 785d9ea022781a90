"""The batch sizes' shape sets share one eager reference (inputs/row_reuse.py): a model whose rows are independent
runs eagerly only on the rows the example's sets do not hold and on the smallest batch (the proof), and its verdict
is the one per-set references give; a model that mixes rows (a norm over the batch) is refused by the proof and
judged on per-set references; an output whose batch axis cannot be told (flattened) shares nothing."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import cann_export

DYNAMIC = "x:0=batch:1..16"  # shape sets at batch 1, 8 and 16 (the example's 2 is its own)
BATCHES: dict[str, list[int]] = {}  # per mode, the batch of each eager forward (the export runs a copy of the model)


class Rows(nn.Module):
    """Linear + tanh per row; ``mode`` couples the rows (``"batch-norm"``: minus the batch mean) or flattens the
    output (``"flat"``). Records the batch of every eager forward on real tensors (not a capture's fake ones) in
    ``BATCHES``."""

    def __init__(self, mode: str = "rows") -> None:
        super().__init__()
        self.fc = nn.Linear(12, 6)
        self.mode = mode
        BATCHES[mode] = []

    def forward(self, x):
        if type(x) is torch.Tensor and not torch.compiler.is_compiling() and not torch.jit.is_tracing():
            BATCHES[self.mode].append(int(x.shape[0]))
        y = torch.tanh(self.fc(x))
        if self.mode == "batch-norm":
            return y - y.mean(0, keepdim=True)
        return y.reshape(-1) if self.mode == "flat" else y


def _export(tmp: Path, mode: str) -> tuple[Rows, dict]:
    torch.manual_seed(0)
    model = Rows(mode).eval()
    result = cann_export.export(model, tmp / mode, "onnx", example_inputs={"x": torch.randn(2, 12)},
                                dynamic=DYNAMIC, sandbox="off", lint="warn")
    assert result.ok, result.manifest["parity"]
    return model, result.manifest


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Rows, dict]]:
    tmp = tmp_path_factory.mktemp("rowreuse")
    return {mode: _export(tmp, mode) for mode in ("rows", "batch-norm", "flat")}


def _shapes(manifest: dict) -> list[dict]:
    return [row["shape"] for row in manifest["parity"]["shapes"]]


def test_independent_rows_share_one_eager_run_and_keep_the_verdict(exported):
    model, manifest = exported["rows"]
    record = manifest["parity"]["reference_reuse"]
    assert record["used"] is True and record["sizes"] == [1, 8, 16], record
    assert record["proof"]["size"] == 1 and record["proof"]["max_share"] <= record["proof"]["limit"]
    # the example's verdict sets (example + random variants, batch 2 each) give their rows; the rest of batch 16
    # runs eagerly at once, and batch 1 (the proof): batch 16 and 8 have no eager run of their own
    taken = record["rows_from_example_sets"]
    assert taken >= 2 and taken % 2 == 0 and record["eager_rows"] == 16 - taken + 1, record
    seen = BATCHES[model.mode]
    assert 16 not in seen and 8 not in seen and 1 in seen, seen
    assert manifest["parity"]["passed"] is True
    assert {"batch": 8} in _shapes(manifest) and {"batch": 16} in _shapes(manifest)  # the graph still runs there


def test_a_batch_coupled_model_is_refused_and_judged_on_its_own_references(exported):
    model, manifest = exported["batch-norm"]
    record = manifest["parity"]["reference_reuse"]
    assert record["used"] is False and "rows are not independent" in record["reason"], record
    assert 16 in BATCHES[model.mode] and 8 in BATCHES[model.mode]  # each batch size ran eagerly
    assert manifest["parity"]["passed"] is True and {"batch": 16} in _shapes(manifest)


def test_an_output_without_a_batch_axis_shares_nothing(exported):
    model, manifest = exported["flat"]
    record = manifest["parity"]["reference_reuse"]
    assert record["used"] is False and "batch axis is not identifiable" in record["reason"], record
    assert 16 in BATCHES[model.mode] and manifest["parity"]["passed"] is True


def test_the_batch_must_be_axis_0_of_every_input():
    from cann_export.dynamic import DynamicAxis
    from cann_export.inputs.row_reuse import batch_dimension

    feed = {"a": torch.zeros(2, 3), "b": torch.zeros(2, 5)}
    both = [DynamicAxis("a", 0, "batch", 1, 16), DynamicAxis("b", 0, "batch", 1, 16)]
    assert batch_dimension(both, feed) == "batch"
    assert batch_dimension(both[:1], feed) is None  # b holds no batch: a row would see all of b
    assert batch_dimension([*both, DynamicAxis("b", 1, "batch", 1, 16)], feed) is None
    assert batch_dimension([DynamicAxis("a", 1, "seq", 1, 16)], feed) is None
