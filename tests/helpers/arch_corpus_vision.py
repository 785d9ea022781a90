"""timm and torchvision architectures of the corpus (see arch_corpus): random seeded weights, no download
(pretrained=False / weights=None), non-trivial BatchNorm statistics, small images. They need timm and a
torchvision that imports beside torch: the ``vision`` tests' environment (tests/vision_env.sh)."""
from __future__ import annotations

import torch

from . import calibration_models as cm


def _image(size, batch=1):
    return {"x": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))}


class Logits(torch.nn.Module):
    """A torchvision segmentation model returns a dict; its ``out`` logits are the output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def _timm(name, size=64, **kwargs):
    def build():
        import timm

        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        return cm._bn_stats(model).eval(), _image(size)
    build.__name__ = name
    return build


def _tv(name, size=64, segmentation=False, **kwargs):
    def build():
        import torchvision

        torch.manual_seed(0)
        models = torchvision.models.segmentation if segmentation else torchvision.models
        model = getattr(models, name)(weights=None, **kwargs)
        model = Logits(model) if segmentation else model
        return cm._bn_stats(model).eval(), _image(size)
    build.__name__ = name
    return build


def _tv_class(name, size, **kwargs):
    """A torchvision architecture class built from a small config (VisionTransformer, SwinTransformer)."""
    def build():
        import torchvision

        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(num_classes=10, **kwargs).eval()
        head = model.heads.head if hasattr(model, "heads") else None
        if head is not None:  # torchvision zero-initialises the ViT head: the output would be constant 0
            torch.nn.init.normal_(head.weight, std=0.02)
        return model, _image(size)
    build.__name__ = name
    return build


TIMM = {
    "timm_resnet10t": _timm("resnet10t"),
    "timm_mobilenetv3_small": _timm("mobilenetv3_small_050"),
    "timm_efficientnet_b0": _timm("efficientnet_b0"),
    "timm_convnext_atto": _timm("convnext_atto"),
    "timm_vit_tiny": _timm("vit_tiny_patch16_224", img_size=64, depth=4),
    "timm_regnetx_002": _timm("regnetx_002"),
    "timm_lcnet_050": _timm("lcnet_050"),
    "timm_ghostnet_050": _timm("ghostnet_050"),
    "timm_edgenext_xx_small": _timm("edgenext_xx_small"),
    "timm_mobilevitv2_050": _timm("mobilevitv2_050"),
    "timm_fastvit_t8": _timm("fastvit_t8"),
}

TORCHVISION = {
    "tv_resnet18": _tv("resnet18", num_classes=10),
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small", num_classes=10),
    "tv_efficientnet_b0": _tv("efficientnet_b0", num_classes=10),
    "tv_shufflenet_v2": _tv("shufflenet_v2_x0_5", num_classes=10),
    "tv_squeezenet": _tv("squeezenet1_1", num_classes=10),
    "tv_mnasnet": _tv("mnasnet0_5", num_classes=10),
    "tv_regnet_y_400mf": _tv("regnet_y_400mf", num_classes=10),
    "tv_googlenet": _tv("googlenet", num_classes=10, aux_logits=False, init_weights=True),
    "tv_deeplabv3": _tv("deeplabv3_mobilenet_v3_large", size=96, segmentation=True, num_classes=4,
                        weights_backbone=None),
    "tv_lraspp": _tv("lraspp_mobilenet_v3_large", size=96, segmentation=True, num_classes=4, weights_backbone=None),
    "tv_vit": _tv_class("VisionTransformer", 32, image_size=32, patch_size=4, num_layers=2, num_heads=4,
                        hidden_dim=64, mlp_dim=128),
    "tv_swin": _tv_class("SwinTransformer", 64, patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                         window_size=[4, 4]),
}
