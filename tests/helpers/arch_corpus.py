"""The architecture corpus (issue 17): healthy third-party architectures nobody here wrote (transformers,
timm, torchvision; small configs, seeded random weights, affordable but realistic input sizes) and models
that really break in real fp16. ``HEALTHY[name]() -> (model, inputs)``; ``BROKEN[name]() -> (model, inputs,
module where real fp16 breaks)``. ``real_fp16`` is the ground truth: the model in half precision in torch.

The vision builders live in ``arch_corpus_vision`` (timm and torchvision: the ``vision`` tests' environment)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from . import arch_corpus_vision as vision
from . import calibration_models as cm

# one layer each: an architecture is its block (attention, norm, mask, embeddings); a second identical block added
# about a second to each export's capture and no other op (qwen2_residual_growth breaks in its layer 0 all the same)
TEXT = {"vocab_size": 500, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 64}
VIT = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128}
DECODER = {**TEXT, "num_key_value_heads": 2, "use_cache": False, "pad_token_id": 0}


def _tokens(seq=16, batch=2, pad=0, mask=True, vocab=500, seed=1):
    inputs = cm._tokens(vocab, seq=seq, batch=batch, pad=pad, seed=seed)
    return inputs if mask else {"input_ids": inputs["input_ids"]}


def _hf(model_class: str, config_class: str, inputs, **config):
    """A builder of ``transformers.<model_class>(<config_class>(**config))``, seeded, in eval mode."""
    def build():
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(**config)
        model = getattr(transformers, model_class)(cfg).eval()
        return cm._bn_stats(model), inputs()
    build.__name__ = model_class
    return build


def _images(size, channels=3):
    return lambda: {"pixel_values": torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(1))}


TRANSFORMERS = {
    # encoders (a padded row: the attention mask's fill is exercised)
    "hf_bert": _hf("BertModel", "BertConfig", lambda: _tokens(pad=5), **TEXT),
    "hf_distilbert": _hf("DistilBertForSequenceClassification", "DistilBertConfig", lambda: _tokens(pad=3),
                         vocab_size=500, dim=64, n_layers=1, n_heads=4, hidden_dim=128, max_position_embeddings=64,
                         num_labels=8),
    "hf_roberta": _hf("RobertaModel", "RobertaConfig", lambda: _tokens(pad=4),
                      **{**TEXT, "max_position_embeddings": 80}),
    "hf_albert": _hf("AlbertModel", "AlbertConfig", lambda: _tokens(pad=4), embedding_size=32, **TEXT),
    "hf_electra": _hf("ElectraForSequenceClassification", "ElectraConfig", lambda: _tokens(pad=4),
                      embedding_size=32, num_labels=3, **TEXT),
    "hf_deberta_v2": _hf("DebertaV2Model", "DebertaV2Config", lambda: _tokens(pad=4), **TEXT),
    "hf_mpnet": _hf("MPNetModel", "MPNetConfig", lambda: _tokens(pad=4), **TEXT),
    "hf_xlm_roberta": _hf("XLMRobertaForMaskedLM", "XLMRobertaConfig", lambda: _tokens(pad=4),
                          **{**TEXT, "max_position_embeddings": 80}),
    "hf_t5_encoder": _hf("T5EncoderModel", "T5Config", lambda: _tokens(pad=4), vocab_size=500, d_model=64, d_kv=16,
                         d_ff=128, num_layers=1, num_heads=4),
    # decoders (causal mask fill, rotary embeddings, RMSNorm, GQA)
    "hf_gpt2": _hf("GPT2LMHeadModel", "GPT2Config", lambda: _tokens(mask=False), vocab_size=500, n_embd=64, n_layer=1,
                   n_head=4, n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0),
    "hf_llama": _hf("LlamaForCausalLM", "LlamaConfig", lambda: _tokens(mask=False), **DECODER),
    "hf_mistral": _hf("MistralForCausalLM", "MistralConfig", lambda: _tokens(mask=False), **DECODER),
    "hf_qwen2": _hf("Qwen2ForCausalLM", "Qwen2Config", lambda: _tokens(mask=False), **DECODER),
    "hf_phi": _hf("PhiForCausalLM", "PhiConfig", lambda: _tokens(mask=False), **DECODER),
    "hf_opt": _hf("OPTForCausalLM", "OPTConfig", lambda: _tokens(mask=False), vocab_size=500, hidden_size=64,
                  num_hidden_layers=1, num_attention_heads=4, ffn_dim=128, max_position_embeddings=64,
                  word_embed_proj_dim=64, use_cache=False, pad_token_id=1),
    "hf_bloom": _hf("BloomForCausalLM", "BloomConfig", lambda: _tokens(mask=False), vocab_size=500, hidden_size=64,
                    n_layer=1, n_head=4, use_cache=False),
    "hf_gpt_neox": _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", lambda: _tokens(mask=False), use_cache=False, **TEXT),
    # vision
    "hf_vit": _hf("ViTForImageClassification", "ViTConfig", _images(32), image_size=32, patch_size=4, num_labels=10,
                  **VIT),
    "hf_convnext": cm.convnext,
    "hf_deit": _hf("DeiTForImageClassification", "DeiTConfig", _images(32), image_size=32, patch_size=4, num_labels=10,
                   **VIT),
    "hf_swin": _hf("SwinForImageClassification", "SwinConfig", _images(64), image_size=64, patch_size=4,
                   embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=10),
    "hf_segformer": _hf("SegformerForSemanticSegmentation", "SegformerConfig", _images(64), num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                        strides=[4, 2], patch_sizes=[7, 3], mlp_ratios=[2, 2], decoder_hidden_size=32,
                        num_labels=4),
    "hf_mobilevit": _hf("MobileViTForImageClassification", "MobileViTConfig", _images(64), image_size=64,
                        hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=10),
    "hf_beit": _hf("BeitForImageClassification", "BeitConfig", _images(32), image_size=32, patch_size=4, num_labels=10,
                   **VIT),
    "hf_dinov2": _hf("Dinov2Model", "Dinov2Config", _images(56), image_size=56, patch_size=14, hidden_size=64,
                     num_hidden_layers=1, num_attention_heads=4, mlp_ratio=2),
    "hf_yolos": _hf("YolosForObjectDetection", "YolosConfig", _images(64), image_size=[64, 64], patch_size=16,
                    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    num_detection_tokens=5, num_labels=3),
    "hf_clip_vision": _hf("CLIPVisionModel", "CLIPVisionConfig", _images(32), image_size=32, patch_size=4, **VIT),
}



class SharpSoftmax(nn.Module):
    def forward(self, logits):
        return torch.softmax(logits * 1e4, dim=-1)  # at most 6e4: finite in fp16, and softmax subtracts the max


class ConfidentClassifier(nn.Module):
    """Logits bounded to +-6 then scaled 1e4: real fp16 computes the softmax correctly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(32, 10)
        self.softmax = SharpSoftmax()

    def forward(self, x):
        return self.softmax(6 * torch.tanh(self.proj(x)))


def softmax_logits_1e4():
    return ConfidentClassifier().eval(), {"x": torch.randn(4, 32, generator=torch.Generator().manual_seed(3))}


# the 224 px segmentation heads and EfficientNet-B0 of the issue are exported by tests/verdict/test_parity_probes.py
HEALTHY = {**TRANSFORMERS, **vision.TIMM, **vision.TORCHVISION, "softmax_logits_1e4": softmax_logits_1e4}


# Broken in real fp16 (each builder: model, inputs, the module where real fp16 breaks).

class NoUpcastRMSNorm(nn.Module):
    """RMSNorm as a careless port writes it: the mean of squares in the input's dtype (no fp32 upcast)."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return self.weight * x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


class NormBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.attn_norm = NoUpcastRMSNorm(width)
        self.mlp = cm.Mlp(width)

    def forward(self, x):
        return x + self.mlp(self.attn_norm(x))


class RMSNormDecoder(nn.Module):
    """A residual stack whose activations sit near 400: every RMSNorm's mean of squares passes 65504."""

    def __init__(self, width=64, depth=3):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([NormBlock(width) for _ in range(depth)])
        self.norm = NoUpcastRMSNorm(width)
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def rmsnorm_no_upcast():
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(3)) * 400
    return RMSNormDecoder().eval(), {"x": x}, "layers.0.attn_norm"


class ScaledSoftmax(nn.Module):
    def forward(self, logits):
        return torch.softmax(logits * 1e5, dim=-1)  # past 65504 in fp16: inf - inf is NaN


class SharpClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(32, 10)
        self.softmax = ScaledSoftmax()

    def forward(self, x):
        return self.softmax(self.proj(x))


def softmax_logits_1e5():
    return SharpClassifier().eval(), {"x": torch.randn(4, 32, generator=torch.Generator().manual_seed(3))}, "softmax"


def qwen2_residual_growth():
    """A tiny Qwen2 whose layer-0 MLP projections grew 300x: its output, added to the residual stream, passes
    65504 (about 4.6e5 in fp32) while every RMSNorm upcasts to fp32 as Qwen2's does."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**DECODER)).eval()
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        for projection in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            projection.weight.mul_(300.0)
    return model, _tokens(mask=False), "model.layers.0.mlp"


def attention_overflow():
    """calibration_models' BERT whose layer-0 query and key weights grew 800x, in one layer (the corpus' depth)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TEXT, attn_implementation="eager")).eval()
    attn = model.encoder.layer[0].attention.self
    with torch.no_grad():
        attn.query.weight.mul_(800.0)
        attn.key.weight.mul_(800.0)
    return model, _tokens(), "encoder.layer.0.attention.self"


BROKEN = {**cm.BROKEN, "attention_overflow": attention_overflow, "rmsnorm_no_upcast": rmsnorm_no_upcast,
          "softmax_logits_1e5": softmax_logits_1e5,
          "qwen2_residual_growth": qwen2_residual_growth}


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    elif hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for o in out for t in _flat(o)]


def real_fp16(model, inputs):
    """(cosine, finite) per float output of ``model.half()`` against fp32 (autocast where half fails)."""
    with torch.no_grad():
        ref = _flat(model(**inputs))
        half_in = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
        try:
            got = _flat(copy.deepcopy(model).half()(**half_in))
        except RuntimeError:  # an op without a CPU half kernel
            with torch.autocast("cpu", dtype=torch.float16):
                got = _flat(model(**inputs))
    truth = []
    for r, g in zip(ref, got, strict=False):
        if not r.is_floating_point():
            continue
        r, g = r.double().flatten(), g.double().flatten()
        finite = bool(torch.isfinite(g[torch.isfinite(r)]).all())
        cos = float(torch.nn.functional.cosine_similarity(r, g, dim=0)) if finite else 0.0
        truth.append((cos, finite))
    return truth


def healthy_in_fp16(truth) -> bool:
    return bool(truth) and all(finite and cos >= 0.999 for cos, finite in truth)


def broken_in_fp16(truth) -> bool:
    return any(not finite or cos < 0.99 for cos, finite in truth)


def cosine(a, b) -> float:
    """Cosine of two arrays as float64 (0 where either holds inf/nan; 1 for two zero arrays)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == nb == 0 else 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))
