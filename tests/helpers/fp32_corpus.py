"""Healthy third-party architectures (torchvision, timm, transformers) from small configs with seeded random
weights, at realistic input sizes, for calibrating the fp32 parity policy (parity_metrics.py); and
graphs that really differ from their model, which the policy must still refuse. Nothing is downloaded.
The torchvision and timm builders need the ``vision`` tests' environment (tests/vision_env.sh)."""
from __future__ import annotations

import torch


def images(size: int = 224, batch: int = 1, seed: int = 1) -> dict[str, torch.Tensor]:
    """ImageNet-normalised-looking pixels: a smooth image plus noise, about zero mean and unit spread."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 3, max(size // 16, 2), max(size // 16, 2), generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    pixels = (0.8 * smooth + 0.2 * torch.rand(batch, 3, size, size, generator=g)).clamp(0, 1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return {"x": (pixels - mean) / std}


def tokens(vocab: int, seq: int = 16, batch: int = 2, seed: int = 1, mask: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feed = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}
    if mask:
        m = torch.ones(batch, seq, dtype=torch.int64)
        m[1:, seq - 4:] = 0
        feed["attention_mask"] = m
    return feed


def lively(model: torch.nn.Module, gain: float = 4.0, seed: int = 3) -> torch.nn.Module:
    """Random BatchNorm statistics and affine weights (gamma in [0.5, 0.5 + gain)), so activations grow with
    depth as trained nets' do and the output is far from the default init's near-constant (torchvision's
    default init gives EfficientNet-B0 outputs of 1e-13); classifier weights N(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.6 - 0.3)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * gain + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            elif isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, 0.05, generator=g)
    return model.eval()


class _Logits(torch.nn.Module):
    """One named input ``x`` and the tensor output of models that return dicts (torchvision segmentation)."""

    def __init__(self, inner: torch.nn.Module, key: str | None = None):
        super().__init__()
        self.inner, self.key = inner, key

    def forward(self, x):
        out = self.inner(x)
        return out[self.key] if self.key else out


def torchvision_model(name: str, size: int = 224, **kwargs):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    key = "out" if name.startswith(("deeplab", "lraspp", "fcn")) else None
    return _Logits(lively(model), key).eval(), images(size)


def timm_model(name: str, size: int = 224, **kwargs):
    import timm

    torch.manual_seed(0)
    return _Logits(lively(timm.create_model(name, pretrained=False, num_classes=10, **kwargs))).eval(), images(size)


def _decoder(config_cls: str, model_cls: str, **extra):
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                            use_cache=False, initializer_range=0.1, **extra)
    return getattr(transformers, model_cls)(cfg).eval(), tokens(128)


def mistral():
    return _decoder("MistralConfig", "MistralForCausalLM", sliding_window=None)


def qwen2():
    return _decoder("Qwen2Config", "Qwen2ForCausalLM")


def llama():
    return _decoder("LlamaConfig", "LlamaForCausalLM")


def bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     max_position_embeddings=64)
    return BertModel(cfg).eval(), tokens(128)


def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64, relative_attention=True,
                          position_buckets=16, pos_att_type=["p2c", "c2p"])
    return DebertaV2Model(cfg).eval(), tokens(128)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    return GPT2LMHeadModel(cfg).eval(), tokens(128, mask=False)


def hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, num_labels=10)
    feed = images(224)
    return ViTForImageClassification(cfg).eval(), {"pixel_values": feed["x"]}


CORPUS = {
    "deeplabv3_mobilenet_v3_large": lambda: torchvision_model("deeplabv3_mobilenet_v3_large", num_classes=21,
                                                              weights_backbone=None, aux_loss=False),
    "lraspp_mobilenet_v3_large": lambda: torchvision_model("lraspp_mobilenet_v3_large", num_classes=21,
                                                           weights_backbone=None),
    "lraspp_mobilenet_v3_large_128px": lambda: torchvision_model("lraspp_mobilenet_v3_large", size=128,
                                                                 num_classes=21, weights_backbone=None),
    "efficientnet_b0": lambda: torchvision_model("efficientnet_b0", num_classes=10),
    "tv_resnet18": lambda: torchvision_model("resnet18", num_classes=10),
    "tv_mobilenet_v3_small": lambda: torchvision_model("mobilenet_v3_small", num_classes=10),
    "tv_regnet_y_400mf": lambda: torchvision_model("regnet_y_400mf", num_classes=10),
    "tv_shufflenet_v2_x0_5": lambda: torchvision_model("shufflenet_v2_x0_5", num_classes=10),
    "timm_convnext_atto": lambda: timm_model("convnext_atto"),
    "timm_vit_tiny": lambda: timm_model("vit_tiny_patch16_224"),
    "timm_mobilevit_xxs": lambda: timm_model("mobilevit_xxs", size=256),
    "timm_efficientnet_b0": lambda: timm_model("efficientnet_b0"),
    "hf_vit": hf_vit,
    "mistral": mistral,
    "qwen2": qwen2,
    "llama": llama,
    "bert": bert,
    "deberta_v2": deberta_v2,
    "gpt2": gpt2,
}
