"""The float64 reference noise is measured only where it can matter (inputs/float_noise.defer): a graph that
passes parity at the verdict rule's least floor never runs the model in float64; one that fails there is judged
again with the noise measured (the same verdict as measuring it up front); a bundle stores the noise its verdict
used (the least floor, or the measured noise)."""
import json
import types

import numpy as np
import onnx
import pytest
import torch
from helpers.toy_models import make_mlp
from safetensors import safe_open

import cann_export
from cann_export import hookimpl
from cann_export.hooks.manager import get_plugin_manager
from cann_export.inputs import float_noise


@pytest.fixture
def runs(monkeypatch):
    """The float64 runs made (the real function, counted)."""
    calls = []
    real = float_noise.fp64_noise

    def counted(*args, **kwargs):
        calls.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(float_noise, "fp64_noise", counted)
    return calls


class ScaleWeight:
    """A graph pass that multiplies the largest initializer by 1.01 (a wrong graph, for the verdict)."""

    name, order = "scale-weight", 950

    def apply_final_graph(self, model, ctx):
        init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        array = onnx.numpy_helper.to_array(init) * np.float32(1.01)
        init.CopyFrom(onnx.numpy_helper.from_array(array.astype(np.float32), init.name))
        return model


@pytest.fixture
def wrong_graph():
    @hookimpl
    def register_passes(register):
        register(ScaleWeight())

    plugin = types.SimpleNamespace(register_passes=register_passes)
    get_plugin_manager().register(plugin, name="scale-weight")
    yield
    get_plugin_manager().unregister(plugin)


def _export(tmp_path, name, fmt="onnx"):
    out = tmp_path / (f"{name}.onnx" if fmt == "onnx" else name)
    return cann_export.export(make_mlp(), out, export_format=fmt, example_inputs={"x": torch.randn(4, 12)})


def test_a_passing_graph_runs_no_float64(tmp_path, runs):
    result = _export(tmp_path, "m")
    assert result.ok and result.parity["passed"] is True
    assert runs == []


def test_a_failing_graph_measures_the_noise_and_keeps_the_verdict(tmp_path, runs, wrong_graph, monkeypatch):
    deferred = _export(tmp_path, "deferred")
    assert runs == [[0, 1, 2]]  # measured once, on the verdict sets, when the least floor refused the graph
    monkeypatch.setattr(float_noise, "defer", lambda ctx: False)  # measured up front, as before
    eager = _export(tmp_path, "eager")
    assert deferred.parity["passed"] is False and deferred.parity == eager.parity


def _stored(bundle):
    with safe_open(str(bundle / "parity" / "inputs.safetensors"), "pt") as f:
        meta = f.metadata()
    return json.loads(meta["noise"]), json.loads(meta["labels"])


def test_a_bundle_stores_the_floor_its_verdict_used(tmp_path, runs):
    """Passed at the least floor: the bundle stores that floor (0.0 per verdict set's output, none for a probe),
    with no float64 run only to store it, and validate judges the stored sets by it."""
    result = _export(tmp_path, "b", fmt="atc_ready")
    assert result.ok and runs == []
    noise, labels = _stored(tmp_path / "b")
    assert noise == [[0.0] if label["role"] == "verdict" else None for label in labels]
    assert cann_export.validate(tmp_path / "b")["passed"] is True


def test_a_bundle_stores_the_noise_its_verdict_measured(tmp_path, runs, wrong_graph):
    _export(tmp_path, "w", fmt="atc_ready")
    assert len(runs) == 1
    noise, labels = _stored(tmp_path / "w")
    verdict = [row for row, label in zip(noise, labels, strict=True) if label["role"] == "verdict"]
    assert verdict and all(row and row[0] > 0 for row in verdict)  # measured: float64 differs from fp32


def _export_conv_bn(tmp_path, name, fmt="onnx"):
    from helpers.toy_models import ConvBnDropout

    torch.manual_seed(0)
    out = tmp_path / (f"{name}.onnx" if fmt == "onnx" else name)
    return cann_export.export(ConvBnDropout(), out, export_format=fmt, example_inputs={"x": torch.randn(2, 3, 16, 16)})


def test_a_folded_batchnorm_model_defers_the_noise_too(tmp_path, runs):
    """strip folds Conv+BN into the conv (its weights rounded to fp32 again): the float64 run still waits for the
    verdict, with the fold's originals on disk, and a passing graph never needs it."""
    result = _export_conv_bn(tmp_path, "bn")
    assert result.ok and result.parity["passed"] is True
    assert runs == []


def test_a_folded_batchnorm_model_measures_the_noise_of_the_model_prepare_ran(tmp_path, runs, wrong_graph,
                                                                               monkeypatch):
    """Measured late, the noise is the unfolded model's to the bit (the float64 twin takes the fold's originals
    back), so the verdict is the one measuring it in prepare gave (the folded model's float64 run differs: its
    larger noise passes sets that fail here)."""
    measured = []
    real = float_noise.measure
    monkeypatch.setattr(float_noise, "measure", lambda ctx: (real(ctx), measured.append(ctx.reference_noise)))
    deferred = _export_conv_bn(tmp_path, "late")
    assert len(runs) == 1
    monkeypatch.setattr(float_noise, "defer", lambda ctx: False)  # measured up front, before the fold
    eager = _export_conv_bn(tmp_path, "early")
    assert deferred.parity["passed"] is False and deferred.parity == eager.parity
    assert any(row and row[0] > 0 for row in measured[0]) and measured[0] == measured[1]
