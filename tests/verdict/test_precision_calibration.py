"""Calibration of the device-precision verdict against ground truth: real fp16 in torch.

Healthy (real fp16 cosine >= 0.999 on every output, all finite) must pass (the broken set, which must fail and
name the module where it breaks, runs in tests/capture/test_arch_corpus.py with the corpus). The ground truth is
computed here, from torch, for every model; the verdict is the tool's, through a full atc_ready export.
"""
import json

import pytest
from helpers import calibration_models as cm
from helpers.arch_corpus import real_fp16

import cann_export

# the architectures tests/capture/test_arch_corpus.py also exports (its own configs), and the broken set, which it
# runs whole (refused, named at the origin, the saturating verdict against an independent emulation)
IN_THE_CORPUS = {"bert", "gpt2", "vit", "convnext", "distilbert_classifier"}
SLOW = {"resnet50_like", "convnext", "efficientnet", "mobilenet_v2", "detr", "attention_overflow"}


def _params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


def _export(model, inputs, tmp_path):
    # real fp16 in torch is IEEE: its device is an Inf/NaN-mode SoC (a saturating one is in
    # tests/verdict/test_soc_overflow.py)
    return cann_export.export(model, tmp_path / "b", example_inputs=inputs, num_random_inputs=1,
                              soc_version="Ascend910B1")


@pytest.mark.parametrize("name", _params(sorted(set(cm.HEALTHY) - IN_THE_CORPUS)))
def test_healthy_architecture_passes(name, tmp_path):
    model, inputs = cm.HEALTHY[name]()
    truth = real_fp16(model, inputs)
    assert truth and all(finite and cos >= 0.999 for cos, finite in truth), truth  # healthy in real fp16
    result = _export(model, inputs, tmp_path)
    parity = result.parity
    assert parity["graph_fp32_passed"] and parity["passed"], parity["outputs"]
    assert "first_divergence" not in parity
    full = json.loads((tmp_path / "b" / "parity.json").read_text(), parse_constant=pytest.fail)
    for out in full["outputs"]:
        assert out["noise_floor"] > 0 and out["non_finite"] is False
        if "logits" in out["name"] and len(out["shape"]) == 2:  # class scores: top-k agreement reported
            assert 0.0 <= out["top1_agreement"] <= out["top5_agreement"] <= 1.0
