"""Models for the device-precision calibration suite: real transformers architectures from small
configs with seeded random weights (healthy in real fp16), and models that real fp16 breaks.

Each builder returns ``(model, inputs)``; inputs are a dict named after forward's parameters."""
from __future__ import annotations

import torch
from torch import nn


def _images(size, batch=1, seed=1):
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))}


def _tokens(vocab, seq=16, batch=2, pad=0, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if pad:
        mask[-1, seq - pad:] = 0  # the last row is padded: the -3.4e38 mask is -inf in fp16
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g), "attention_mask": mask}


def _bn_stats(model):
    with torch.no_grad():  # non-trivial BatchNorm statistics (fresh ones are 0/1)
        g = torch.Generator().manual_seed(2)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
    return model


def resnet50_like(size=224):
    """ResNet-50's depth and bottleneck blocks ([3, 4, 6, 3]) at a quarter of its width, 224 px."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[64, 128, 256, 512], depths=[3, 4, 6, 3],
                       layer_type="bottleneck", num_labels=100)
    return _bn_stats(ResNetForImageClassification(cfg)).eval(), _images(size)


def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    cfg = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10)
    return ConvNextForImageClassification(cfg).eval(), _images(64)


def efficientnet():
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    torch.manual_seed(0)
    cfg = EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.3, num_labels=10,
                             hidden_dim=320)
    return _bn_stats(EfficientNetForImageClassification(cfg)).eval(), _images(64)


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    cfg = MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    return _bn_stats(MobileNetV2ForImageClassification(cfg)).eval(), _images(64)


def regnet():
    from transformers import RegNetConfig, RegNetForImageClassification

    torch.manual_seed(0)
    cfg = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], groups_width=8,
                       num_labels=10)
    return _bn_stats(RegNetForImageClassification(cfg)).eval(), _images(64)


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=128, num_labels=10)
    return ViTForImageClassification(cfg).eval(), _images(32)


def bert(pad=5):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
    return BertModel(cfg).eval(), _tokens(500, pad=pad)


def distilbert_classifier():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=500, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                           max_position_embeddings=64, num_labels=8)
    return DistilBertForSequenceClassification(cfg).eval(), _tokens(500, pad=3)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    inputs = _tokens(500)
    return GPT2LMHeadModel(cfg).eval(), {"input_ids": inputs["input_ids"]}


def detr():
    """DETR's box regressor (sigmoid boxes that span ~1e-3 with random weights) on a small ResNet."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            layer_type="basic", out_features=["stage4"])
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
                     d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
                     num_labels=5)
    return _bn_stats(DetrForObjectDetection(cfg)).eval(), {**_images(64), "pixel_mask": torch.ones(1, 64, 64,
                                                                                                  dtype=torch.int64)}


HEALTHY = {"resnet50_like": resnet50_like, "convnext": convnext, "efficientnet": efficientnet,
           "mobilenet_v2": mobilenet_v2, "regnet": regnet, "vit": vit, "bert": bert,
           "distilbert_classifier": distilbert_classifier, "gpt2": gpt2, "detr": detr}


# Broken in fp16: each builder returns (model, inputs, the module real fp16 breaks in).

class Energy(nn.Module):
    def forward(self, h):
        return (h * h).sum(-1, keepdim=True)  # a sum of squares over a long axis: past 65504 in fp16


class ReductionOverflow(nn.Module):
    def __init__(self, width=1300):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(width, width)
        self.energy = Energy()
        self.head = nn.Linear(1, 4)

    def forward(self, x):
        return self.head(torch.sqrt(self.energy(self.proj(x))) / 100)


def reduction_overflow():
    x = torch.randn(2, 1300, generator=torch.Generator().manual_seed(3)) * 30
    return ReductionOverflow().eval(), {"x": x}, "energy"


class Mlp(nn.Module):
    def __init__(self, width, gain=1.0):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        with torch.no_grad():
            self.up.weight.mul_(gain)
            self.down.weight.mul_(gain)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class HugeActivations(nn.Module):
    """A residual MLP stack whose third block was trained into activations past 1e5."""

    def __init__(self, width=64):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Mlp(width), Mlp(width), Mlp(width, gain=400.0), Mlp(width)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.norm(x))


def huge_activations():
    return HugeActivations().eval(), {"x": torch.randn(4, 64, generator=torch.Generator().manual_seed(3))}, "blocks.2"


class NaiveSoftmax(nn.Module):
    def forward(self, x):
        e = torch.exp(x)  # no max subtraction: exp(12) is past 65504
        return e / e.sum(-1, keepdim=True)


class ExpOverflow(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(32, 16)
        self.softmax = NaiveSoftmax()

    def forward(self, x):
        return self.softmax(self.proj(x) * 4 + 10)


def exp_overflow():
    return ExpOverflow().eval(), {"x": torch.randn(4, 32, generator=torch.Generator().manual_seed(3))}, "softmax"


class Offset(nn.Module):
    def __init__(self, value=1e5):
        super().__init__()
        self.register_buffer("value", torch.tensor(value))

    def forward(self, x):
        return (x + self.value) * 1e-5  # 1e5 is past 65504: inf in fp16


class LargeConstant(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.offset = Offset()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.offset(self.proj(x)))


def large_constant():
    return LargeConstant().eval(), {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(3))}, "offset"


class Cancel(nn.Module):
    def forward(self, x):
        return (x + 2000.0) - 2000.0  # fp16 spacing at 2000 is 1: x (about 0.1) is lost


class Cancellation(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.cancel = Cancel()
        self.head = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.head(self.cancel(self.proj(x) * 0.1))


def cancellation():
    return Cancellation().eval(), {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(3))}, "cancel"


def attention_overflow():
    """BERT whose first layer's query and key weights grew 800x: attention logits past 65504."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")
    model = BertModel(cfg).eval()
    attn = model.encoder.layer[0].attention.self
    with torch.no_grad():
        attn.query.weight.mul_(800.0)
        attn.key.weight.mul_(800.0)
    return model, _tokens(500), "encoder.layer.0.attention.self"


BROKEN = {"reduction_overflow": reduction_overflow, "huge_activations": huge_activations,
          "exp_overflow": exp_overflow, "large_constant": large_constant, "cancellation": cancellation,
          "attention_overflow": attention_overflow}
