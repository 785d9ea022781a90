"""The element budget of a multi-graph component's parity shapes (inputs/parity_budget.py): a shape whose one input
set (inputs + outputs, with the graphs run to feed it) passes it is not run, a range end gives way to the largest
size within it, what was left out is recorded in the component's manifest (``parity.shape_budget``) with how to
run it, ``validate`` re-derives the same shapes from the graphs and the recorded budget, and
``--parity-full-ranges`` runs the ends. A tiny GPT-2 fits the real budget's 2^24-element floor whole, so the floor
is lowered here to make it bite."""
from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from cann_export import api
from cann_export.cli.main import cli
from cann_export.inputs import parity_budget as budget
from cann_export.bundle.graph_shape_check import component_shape_problems
from cann_export.inputs.parity_budget import budget_for, dim_size
from cann_export.inputs.activations import largest
from helpers.hf_models import tiny_decoder_gpt2


def _gpt2():
    return tiny_decoder_gpt2()


@pytest.fixture(scope="module")
def low_floor():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(budget, "FLOOR", 1)  # the budget is a third of this model's weights
        yield


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory, low_floor):
    out = tmp_path_factory.mktemp("budget") / "gpt2"
    result = api.export_multi(_gpt2(), out, num_random_inputs=1)
    assert result.ok, result.to_dict()
    return out


def _own(bundle, name):
    return json.loads((bundle / "components" / name / "manifest.json").read_text())


def _elements(bundle, name, point):
    """One input set's elements at ``point``, from the written graph's symbolic dims (not the exporter's count)."""
    graph = onnx.load(str(bundle / "components" / name / "model.onnx"), load_external_data=False).graph
    total = 0
    for v in [*graph.input, *graph.output]:
        n = 1
        for d in v.type.tensor_type.shape.dim:
            n *= d.dim_value if d.HasField("dim_value") else dim_size(d.dim_param, point)
        total += n
    return total


def _with_activations(bundle, name, point):
    """A graph's inputs and outputs at ``point`` plus LIVE times its largest intermediate (the recorded estimate)."""
    own = _own(bundle, name)
    terms = own["parity"]["shape_budget"]["activations"]
    assert terms, "the estimate of the graph's intermediates is recorded"
    example = own["parity"]["shapes"][0]["shape"]
    return _elements(bundle, name, point) + budget.LIVE * largest(terms, example, point)


def _set_elements(bundle, name, point):
    """Decode's set with the prefill that makes its past (P tokens of prompt for a past of P): the prefill's inputs
    and outputs (its intermediates are gone when decode's graph runs)."""
    own = _with_activations(bundle, name, point)
    if name == "prefill":
        return own
    return own + _elements(bundle, "prefill", {"batch_size": point["batch_size"],
                                               "sequence_length": point["past_sequence_length"]})


def test_default_shapes_stay_within_the_budget_and_record_what_they_left_out(budgeted):
    for name, length in (("prefill", "sequence_length"), ("decode", "past_sequence_length")):
        own = _own(budgeted, name)
        record = own["parity"]["shape_budget"]
        limit = record["elements"]
        shapes = [r["shape"] for r in own["parity"]["shapes"]]
        # a third of the weights, or the example's own set where that is larger (it runs whatever the budget)
        assert record["full"] is False and limit == budget_for(record["weights"], _set_elements(budgeted, name,
                                                                                                 shapes[0]))
        assert limit == max(record["weights"] // 3, _set_elements(budgeted, name, shapes[0]))
        assert all(_set_elements(budgeted, name, s) <= limit for s in shapes), (name, shapes)
        batches = [s["batch_size"] for s in shapes if s[length] == 7]
        top = max(batches)  # the largest batch within the budget: one more row passes it
        assert 1 < top < 64
        assert _set_elements(budgeted, name, {**shapes[0], "batch_size": top + 1}) > limit
        left = {(g["dimension"], g["size"]) for g in record["left_out"]}
        assert ("batch_size", 64) in left and all("--parity-full-ranges" in g["reason"] for g in record["left_out"])
        assert all(g["elements"] > limit for g in record["left_out"])
    own = _own(budgeted, "prefill")
    prefill, limit = [r["shape"] for r in own["parity"]["shapes"]], own["parity"]["shape_budget"]["elements"]
    for end in ({"batch_size": 2, "sequence_length": 1}, {"batch_size": 2, "sequence_length": 16}):
        assert (end in prefill) == (_set_elements(budgeted, "prefill", end) <= limit)  # a range end within it runs


def test_validate_rederives_the_budgeted_shapes(budgeted):
    assert api.validate(budgeted)["passed"] is True
    own = _own(budgeted, "prefill")
    assert component_shape_problems("prefill", own) == []
    own["parity"]["shape_budget"]["full"] = True  # claims the full ends ran: the re-derived shapes differ
    assert "a range changed after parity ran" in component_shape_problems("prefill", own)[0]
    own = _own(budgeted, "prefill")
    own["parity"]["shape_budget"]["elements"] *= 4  # a budget the rule does not give
    assert "is not the budget of" in component_shape_problems("prefill", own)[0]


def test_parity_full_ranges_runs_the_range_ends(tmp_path, low_floor):
    src = tmp_path / "tiny-gpt2"
    _gpt2().save_pretrained(src)
    out = tmp_path / "full"
    r = CliRunner().invoke(cli, [str(src), "--format", "onnx", "-o", str(out), "--parity-full-ranges",
                                 "--no-sandbox"])
    assert r.exit_code == 0, r.output
    own = _own(out, "prefill")
    assert own["parity"]["shape_budget"]["full"] is True
    assert {"batch_size": 64, "sequence_length": 7} in [row["shape"] for row in own["parity"]["shapes"]]
    assert CliRunner().invoke(cli, ["validate", str(out)]).exit_code == 0


def test_validate_refuses_a_range_widened_past_the_budgets_cap(budgeted):
    """Past the cap the kept points do not depend on the range's end: the recorded left-out sizes do."""
    own = _own(budgeted, "prefill")
    hints = own["atc"]["hints"]
    assert "1~64" in hints["input_shape"]
    hints["input_shape"] = hints["input_shape"].replace("1~64", "1~128")  # batch widened after parity ran
    problems = component_shape_problems("prefill", own)
    assert problems and "left_out" in problems[0] and "a range changed after parity ran" in problems[0]


def test_hostile_dims_and_feeding_loops_are_counted_cheaply(budgeted):
    """Element counts stop past the ceiling (a manifest's huge dims) and each feeder is built once (a loop of
    connections among many components)."""
    from cann_export.bundle.graph_shape_check import graph_elements
    from helpers.deadline import deadline

    huge = budget.shape_elements([[10 ** 4000, 2] * 2000, ["n"] * 5000], dim_size)
    own = _own(budgeted, "prefill")
    owns = {f"c{i}": own for i in range(64)}
    loop = [{"from": {"component": f"c{i}"}, "to": {"component": f"c{j}"}} for i in range(64) for j in range(64)]
    with deadline(20):
        assert huge({"n": 3}) == budget.CEILING + 1
        assert graph_elements("c0", owns, loop)({"batch_size": 2, "sequence_length": 7}) > 0
