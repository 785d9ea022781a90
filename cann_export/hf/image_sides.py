"""Which vision architectures compute at any image height and width, and over which sides their graphs are
checked: a convolutional network whose padding and pooling do not depend on the input's size (ResNet, ConvNeXt,
MobileNetV2 without TensorFlow padding) keeps ``pixel_values``' height and width dynamic, from its total stride
(one cell of its last feature map) to twice the example's side; every other architecture keeps them fixed at the
example's size, with the reason recorded in the manifest (``model.static_axes``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIDE_HEADROOM = 2  # a dynamic side is checked up to twice the example's (4x the pixels: ResNet-50 at 448 x 448)
# model_type -> why its height and width stay fixed (checked before the catch-all of an architecture not listed)
FIXED_WHY = {
    "vit": "ViT adds a position table of (image_size / patch_size)^2 patches, so the model refuses any other image "
           "size (transformers interpolates the table only when forward is called with interpolate_pos_encoding)",
    "deit": "DeiT adds a fixed position table of (image_size / patch_size)^2 patches",
    "beit": "BEiT's relative position tables are built for image_size / patch_size patches per side",
    "clip": "CLIP's vision tower adds a fixed position table of (image_size / patch_size)^2 patches",
    "siglip": "SigLIP's vision tower adds a fixed position table of (image_size / patch_size)^2 patches",
    "swin": "Swin pads and shifts its attention windows from the input's size in Python, so a graph holds the "
            "example's windows",
}
TF_PADDING_WHY = ("MobileNetV2 with tf_padding (config.json) computes each convolution's SAME padding from its "
                  "input's size in Python, so a graph holds the example's padding; a model saved with "
                  "tf_padding false keeps height and width dynamic")
OTHER_WHY = ("{model_type} is not among the architectures known to compute at any image size (ResNet, ConvNeXt, "
             "MobileNetV2 without tf_padding); give --dynamic pixel_values:2=height:LO..HI,3=width:LO..HI to try "
             "other sizes (parity checks them at the range's ends and middle)")


@dataclass(frozen=True)
class ImageSides:
    """``sides``: the (min, max) height and width the graph takes, or None when fixed for the reason ``why``."""

    sides: tuple[int, int] | None
    why: str | None = None


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _stages(config: Any, name: str) -> int:
    value = _field(config, name)
    if isinstance(value, (list, tuple)):
        return max(1, len(value))
    return value if type(value) is int and 0 < value <= 16 else 4


def total_stride(config: Any) -> int | None:
    """The downsampling from pixels to the last feature map, from the config; None for an architecture whose
    graph is not known to take any side."""
    model_type = str(_field(config, "model_type") or "")
    if model_type == "resnet":  # a 4x stem, then every stage but the first halves
        return 4 * 2 ** (_stages(config, "depths") - 1)
    if model_type == "convnext":  # a patch_size stem, then every stage but the first halves
        patch = _field(config, "patch_size")
        stem = patch if type(patch) is int and 0 < patch <= 64 else 4
        return stem * 2 ** (_stages(config, "num_stages") - 1)
    if model_type == "mobilenet_v2" and _field(config, "tf_padding") is False:
        stride = _field(config, "output_stride")
        return stride if type(stride) is int and 0 < stride <= 32 else 32
    return None


def image_sides(config: Any, example: int) -> ImageSides:
    """The sides a graph of ``config``'s architecture takes around the ``example`` side."""
    stride = total_stride(config)
    if stride is not None:
        return ImageSides((min(stride, example), max(SIDE_HEADROOM * example, stride)))
    model_type = str(_field(config, "model_type") or "this architecture")
    if model_type == "mobilenet_v2":
        return ImageSides(None, TF_PADDING_WHY)
    return ImageSides(None, FIXED_WHY.get(model_type, OTHER_WHY.format(model_type=model_type)))
