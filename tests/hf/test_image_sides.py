"""Vision graphs from Hugging Face directories keep height and width dynamic where the architecture computes at any
size (ResNet, ConvNeXt, MobileNetV2 without tf_padding): ATC gets a range (or the gears asked), parity runs at the
range's ends and middle, the manifest names the axes height / width, and onnxruntime at a size that is no example
equals transformers' eager model. Where the architecture cannot (ViT's position table, MobileNetV2's TensorFlow
padding) they stay fixed and the manifest says why."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

import cann_export
from cann_export.cli.main import cli

CASES = {  # tiny configs, random weights; ResNet's config has no image_size (the example side is 224)
    "resnet": ("ResNetForImageClassification", "ResNetConfig",
               dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)),
    "convnext": ("ConvNextForImageClassification", "ConvNextConfig",
                 dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=32, num_labels=3)),
    "mobilenet_v2_same": ("MobileNetV2ForImageClassification", "MobileNetV2Config",
                          dict(depth_multiplier=0.25, image_size=32, num_labels=3, initializer_range=0.3)),
    "mobilenet_v2": ("MobileNetV2ForImageClassification", "MobileNetV2Config",
                     dict(depth_multiplier=0.25, image_size=32, num_labels=3, tf_padding=False,
                          initializer_range=0.3)),  # the default 0.02 vanishes to 1e-26 logits
    "vit": ("ViTForImageClassification", "ViTConfig",
            dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=37, num_labels=3)),
}


def _save(name, directory):
    import transformers

    cls, config, kwargs = CASES[name]
    torch.manual_seed(0)
    getattr(transformers, cls)(getattr(transformers, config)(**kwargs)).eval().save_pretrained(str(directory))
    return directory


def _eager(name, directory, pixels):
    import transformers

    model = getattr(transformers, CASES[name][0]).from_pretrained(str(directory)).eval()
    with torch.no_grad():
        return model(pixel_values=pixels).logits.numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (model directory, atc_ready bundle), each exported once with no flags."""
    root = tmp_path_factory.mktemp("sides")
    cache = {}

    def get(name, *flags):
        key = (name, *flags)
        if key not in cache:
            directory = root / name
            if not directory.exists():
                _save(name, directory)
            out = root / f"{name}{len(cache)}"
            result = CliRunner().invoke(cli, [str(directory), "--format", "atc_ready", "-o", str(out), *flags],
                                        catch_exceptions=False)
            assert result.exit_code == 0, result.output
            cache[key] = (directory, out)
        return cache[key]

    return get


def _pixel_input(bundle):
    return json.loads((bundle / "manifest.json").read_text())["model"]["inputs"][0]


SLOW = pytest.mark.slow  # past 30 s each on a loaded 2-core machine


@pytest.mark.parametrize("name, sides", [pytest.param("resnet", (8, 448), marks=SLOW), ("convnext", (8, 64)),
                                         pytest.param("mobilenet_v2", (32, 64), marks=SLOW)])
def test_a_convolutional_network_keeps_height_and_width_dynamic_and_computes_at_other_sizes(
        name, sides, exported, run_ort):
    directory, bundle = exported(name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert _pixel_input(bundle)["shape"] == ["batch_size", 3, "height", "width"]
    assert "static_axes" not in manifest["model"]
    lo, hi = sides
    assert f"--input_shape=pixel_values:1~16,3,{lo}~{hi},{lo}~{hi}" in manifest["atc"]["command"]
    axes = {a["name"]: (a["min"], a["max"]) for a in manifest["atc"]["dynamic"]["axes"]}
    assert axes["height"] == axes["width"] == sides
    checked = [s["shape"] for s in json.loads((bundle / "parity.json").read_text())["shapes"]]
    example = checked[0]["height"]
    for side in (lo, (lo + hi) // 2, hi):  # the range's ends and middle, each side on its own
        assert {**checked[0], "height": side} in checked and {**checked[0], "width": side} in checked
    # onnxruntime at a size that is not the example's, and not square, against transformers itself
    pixels = torch.randn(3, 3, example + 8, example - 4, generator=torch.Generator().manual_seed(3))
    _, (logits,) = run_ort(bundle / "model.onnx", {"pixel_values": pixels})
    np.testing.assert_allclose(logits, _eager(name, directory, pixels), atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("name, why", [("vit", "position table"), ("mobilenet_v2_same", "tf_padding")])
def test_an_architecture_that_fixes_its_image_size_keeps_it_and_says_why(name, why, exported):
    _, bundle = exported(name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert _pixel_input(bundle)["shape"] == ["batch_size", 3, 32, 32]
    (fixed,) = manifest["model"]["static_axes"]
    assert fixed["input"] == "pixel_values" and fixed["axes"] == {"2": "height", "3": "width"}
    assert fixed["sizes"] == [32, 32] and why in fixed["why"]
    assert manifest["capture"]["exporter"] == "torchscript"  # no capture spent on a dynamic side that cannot be
    assert "--input_shape=pixel_values:1~16,3,32,32" in manifest["atc"]["command"]
    assert cann_export.validate(bundle)["passed"] is True  # validate takes the recorded reason


def test_gears_asked_for_height_and_width_become_atc_dynamic_dims_and_are_each_checked(exported, run_ort):
    directory, bundle = exported("convnext", "--dynamic", "height=24,32,48", "--dynamic", "width=24,32,48")
    manifest = json.loads((bundle / "manifest.json").read_text())
    command = manifest["atc"]["command"]
    assert "--input_shape=pixel_values:2,3,-1,-1" in command  # the batch left static at the example (gears asked)
    dims = next(a for a in command if a.startswith("--dynamic_dims="))
    assert set(dims.split("=", 1)[1].split(";")) >= {"24,32", "48,24", "32,48"}
    checked = [s["shape"] for s in json.loads((bundle / "parity.json").read_text())["shapes"]]
    for side in (24, 48):
        assert {"height": side, "width": 32} in checked and {"height": 32, "width": side} in checked
    dims = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == [2, 3, "height", "width"]
    pixels = torch.randn(2, 3, 48, 24, generator=torch.Generator().manual_seed(4))
    _, (logits,) = run_ort(bundle / "model.onnx", {"pixel_values": pixels})
    np.testing.assert_allclose(logits, _eager("convnext", directory, pixels), atol=2e-4, rtol=1e-3)
