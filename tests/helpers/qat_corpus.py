"""The QAT architecture corpus (issue 18): real third-party architectures (transformers, timm, torchvision) from
small configs with seeded random weights (nothing downloaded), each as a user would fine-tune it with the
articles' QAT loop. ``CORPUS[name]() -> QatCase``: the model in train mode, a few (inputs, target) training
batches, the loss, the export's example inputs and ``inputs(seed)`` (fresh inputs of the example's shapes).

The configs are the fp16 corpus's (arch_corpus, arch_corpus_vision, calibration_models), made smaller where
an export took more than a few seconds. timm and torchvision: the ``vision`` tests' environment
(tests/vision_env.sh)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from . import calibration_models as cm

TRAIN_BATCH, EXPORT_BATCH, STEPS = 4, 2, 3


class QatCase(NamedTuple):
    model: nn.Module  # in train mode, not yet quantized (the loop's first forward inserts fake quantization)
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]]
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    example_inputs: dict[str, torch.Tensor]
    inputs: Callable[[int], dict[str, torch.Tensor]]  # seed -> fresh inputs shaped as example_inputs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(size: int, channels: int = 3, key: str = "pixel_values") -> Callable[[int, int], dict]:
    return lambda seed, batch: {key: torch.randn(batch, channels, size, size, generator=_gen(seed))}


def _tokens(vocab: int, seq: int = 16, mask: bool = True, pad: int = 2) -> Callable[[int, int], dict]:
    def make(seed: int, batch: int) -> dict:
        ids = torch.randint(1, vocab, (batch, seq), generator=_gen(seed))
        if not mask:
            return {"input_ids": ids}
        attention = torch.ones(batch, seq, dtype=torch.int64)
        attention[-1, seq - pad:] = 0  # a padded last row: the attention mask's fill is exercised
        return {"input_ids": ids, "attention_mask": attention}
    return make


def _audio(mels: int, frames: int) -> Callable[[int, int], dict]:
    return lambda seed, batch: {"input_features": torch.randn(batch, mels, frames, generator=_gen(seed))}


def _labels(classes: int) -> Callable[[int, dict], torch.Tensor]:
    return lambda seed, inputs: torch.randint(0, classes, (TRAIN_BATCH,), generator=_gen(seed + 1000))


def _case(model: nn.Module, make: Callable[[int, int], dict], target: Callable[[int, dict], torch.Tensor],
          loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> QatCase:
    batches = []
    for step in range(STEPS):
        inputs = make(10 + step, TRAIN_BATCH)
        batches.append((inputs, target(step, inputs)))
    return QatCase(cm._bn_stats(model).train(), batches, loss_fn, make(1, EXPORT_BATCH),
                   lambda seed: make(seed, EXPORT_BATCH))


def _logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def _ce(out: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_logits(out), target)


def _seg_ce(out: Any, target: torch.Tensor) -> torch.Tensor:
    logits = _logits(out)  # SegFormer: logits at 1/4 of the image; the label map at that size
    return F.cross_entropy(logits, target[:, : logits.shape[-2], : logits.shape[-1]])


def _hidden_mse(out: Any, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.last_hidden_state.mean(1), target)


def _lm(out: Any, target: torch.Tensor) -> torch.Tensor:
    logits = out.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))


def _hf(model_class: str, config_class: str, **config: Any) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**config))


def _timm(name: str, **kwargs: Any) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)


def hf_mobilenet_v2() -> QatCase:
    model = _hf("MobileNetV2ForImageClassification", "MobileNetV2Config", depth_multiplier=0.35, image_size=64,
                num_labels=10)
    return _case(model, _images(64), _labels(10), _ce)


def timm_mobilenetv3() -> QatCase:
    return _case(_timm("mobilenetv3_small_050"), _images(64, key="x"), _labels(10), _ce)


def tv_mobilenet_v3() -> QatCase:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=10)
    return _case(model, _images(64, key="x"), _labels(10), _ce)


def hf_efficientnet() -> QatCase:
    model = _hf("EfficientNetForImageClassification", "EfficientNetConfig", image_size=64, width_coefficient=0.25,
                depth_coefficient=0.3, hidden_dim=320, num_labels=10)
    return _case(model, _images(64), _labels(10), _ce)


def hf_resnet() -> QatCase:
    model = _hf("ResNetForImageClassification", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32],
                depths=[1, 1], layer_type="basic", num_labels=10)
    return _case(model, _images(32), _labels(10), _ce)


def hf_convnext() -> QatCase:
    model = _hf("ConvNextForImageClassification", "ConvNextConfig", hidden_sizes=[16, 32, 64, 128],
                depths=[1, 1, 1, 1], num_labels=10)
    return _case(model, _images(64), _labels(10), _ce)


def hf_vit() -> QatCase:
    model = _hf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=4, hidden_size=64,
                num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_labels=10)
    return _case(model, _images(32), _labels(10), _ce)


def hf_deit() -> QatCase:
    model = _hf("DeiTForImageClassification", "DeiTConfig", image_size=32, patch_size=4, hidden_size=64,
                num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_labels=10)
    return _case(model, _images(32), _labels(10), _ce)


def hf_mobilevit() -> QatCase:
    # 128 px: the last stage's 4 x 4 map holds 4 patches of 2 x 2 (at 64 px a single patch: its attention's softmax
    # over one key is 1, onnxsim folds the query and key layers away and the export refuses their lost Q/DQ)
    model = _hf("MobileViTForImageClassification", "MobileViTConfig", image_size=128, hidden_sizes=[32, 48, 64],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=10)
    return _case(model, _images(128), _labels(10), _ce)


def hf_segformer() -> QatCase:
    model = _hf("SegformerForSemanticSegmentation", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1],
                sr_ratios=[4, 2], hidden_sizes=[16, 32], num_attention_heads=[1, 2], strides=[4, 2],
                patch_sizes=[7, 3], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=4)

    def label_map(seed: int, inputs: dict) -> torch.Tensor:
        return torch.randint(0, 4, (TRAIN_BATCH, 64, 64), generator=_gen(seed + 1000))
    return _case(model, _images(64), label_map, _seg_ce)


def hf_bert() -> QatCase:
    model = _hf("BertModel", "BertConfig", vocab_size=500, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    return _case(model, _tokens(500), lambda seed, inputs: torch.randn(TRAIN_BATCH, 64, generator=_gen(seed)),
                 _hidden_mse)


def hf_distilbert() -> QatCase:
    model = _hf("DistilBertForSequenceClassification", "DistilBertConfig", vocab_size=500, dim=64, n_layers=2,
                n_heads=4, hidden_dim=128, max_position_embeddings=64, num_labels=8)
    return _case(model, _tokens(500), _labels(8), _ce)


def hf_gpt2() -> QatCase:
    model = _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                use_cache=False, bos_token_id=0, eos_token_id=0)
    return _case(model, _tokens(500, mask=False), lambda seed, inputs: inputs["input_ids"], _lm)


def hf_whisper_encoder() -> QatCase:
    # WhisperModel's encoder: 2 x max_source_positions mel frames in, max_source_positions x d_model out
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    model = WhisperEncoder(WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                         encoder_ffn_dim=128, max_source_positions=32))
    return _case(model, _audio(16, 64), lambda seed, inputs: torch.randn(TRAIN_BATCH, 64, generator=_gen(seed)),
                 _hidden_mse)


CORPUS: dict[str, Callable[[], QatCase]] = {
    "hf_mobilenet_v2": hf_mobilenet_v2,
    "timm_mobilenetv3": timm_mobilenetv3,
    "tv_mobilenet_v3": tv_mobilenet_v3,
    "hf_efficientnet": hf_efficientnet,
    "hf_resnet": hf_resnet,
    "hf_convnext": hf_convnext,
    "hf_vit": hf_vit,
    "hf_deit": hf_deit,
    "hf_mobilevit": hf_mobilevit,
    "hf_segformer": hf_segformer,
    "hf_bert": hf_bert,
    "hf_distilbert": hf_distilbert,
    "hf_gpt2": hf_gpt2,
    "hf_whisper_encoder": hf_whisper_encoder,
}
