"""Hugging Face model directories from tiny configs with random weights (save_pretrained; nothing downloaded):
``CASES[name] = HfCase(...)``, each with the task cann-export should export, Optimum's input and output names,
and how transformers computes those outputs eagerly (the yardstick of the ONNX run)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
            max_position_embeddings=64)


@dataclass(frozen=True)
class HfCase:
    cls: str  # the transformers class saved
    config: str  # its config class
    kwargs: dict[str, Any]
    task: str  # what cann-export detects (or --task, when ``flag``)
    inputs: list[str]
    outputs: list[str]
    flag: bool = False  # detection picks a multi-graph task (a decoder's default is -with-past): pass --task
    encoder: bool = False  # the eager yardstick is model.get_encoder()
    extra: dict[str, Any] = field(default_factory=dict)


CASES = {
    "bert": HfCase("BertForSequenceClassification", "BertConfig", {**TEXT, "num_labels": 3}, "text-classification",
                   ["input_ids", "attention_mask", "token_type_ids"], ["logits"]),
    "roberta": HfCase("RobertaForTokenClassification", "RobertaConfig", {**TEXT, "type_vocab_size": 1, "num_labels": 4},
                      "token-classification", ["input_ids", "attention_mask"], ["logits"]),
    "distilbert": HfCase("DistilBertForQuestionAnswering", "DistilBertConfig",
                         dict(vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=37, max_position_embeddings=64),
                         "question-answering", ["input_ids", "attention_mask"], ["start_logits", "end_logits"]),
    "deberta_v2": HfCase("DebertaV2ForSequenceClassification", "DebertaV2Config",  # v3's: no token types
                         {**TEXT, "type_vocab_size": 0, "num_labels": 2}, "text-classification",
                         ["input_ids", "attention_mask"], ["logits"]),
    "gpt2": HfCase("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=100, n_embd=32, n_layer=1, n_head=2,
                                                         n_positions=64),
                   "text-generation", ["input_ids", "attention_mask", "position_ids"], ["logits"], flag=True),
    "llama": HfCase("LlamaForCausalLM", "LlamaConfig", {**TEXT, "num_key_value_heads": 1}, "text-generation",
                    ["input_ids", "attention_mask", "position_ids"], ["logits"], flag=True),
    "qwen2": HfCase("Qwen2ForCausalLM", "Qwen2Config", {**TEXT, "num_key_value_heads": 1}, "text-generation",
                    ["input_ids", "attention_mask", "position_ids"], ["logits"], flag=True),
    "mistral": HfCase("MistralModel", "MistralConfig", {**TEXT, "num_key_value_heads": 1}, "feature-extraction",
                      ["input_ids", "attention_mask"], ["last_hidden_state"]),
    "vit": HfCase("ViTForImageClassification", "ViTConfig",
                  dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=37, num_labels=3), "image-classification", ["pixel_values"], ["logits"]),
    "convnext": HfCase("ConvNextForImageClassification", "ConvNextConfig",
                       dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=32, num_labels=3),
                       "image-classification", ["pixel_values"], ["logits"]),
    "segformer": HfCase("SegformerForSemanticSegmentation", "SegformerConfig",
                        dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=16, num_labels=3, image_size=32),
                        "image-segmentation", ["pixel_values"], ["logits"]),
    "swin": HfCase("SwinModel", "SwinConfig", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1],
                                                   num_heads=[2], window_size=4),
                   "feature-extraction", ["pixel_values"], ["last_hidden_state"]),
    "clip_vision": HfCase("CLIPVisionModel", "CLIPVisionConfig",
                          dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                               num_attention_heads=2), "feature-extraction", ["pixel_values"],
                          ["last_hidden_state", "pooler_output"]),
    "clip_text": HfCase("CLIPTextModelWithProjection", "CLIPTextConfig",
                        {**TEXT, "max_position_embeddings": 32, "projection_dim": 16}, "feature-extraction",
                        ["input_ids", "attention_mask"], ["text_embeds", "last_hidden_state"]),
    "clip": HfCase("CLIPModel", "CLIPConfig",  # composite: the fields live in text_config / vision_config
                   dict(text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=32, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0),
                        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37,
                                           num_hidden_layers=1, num_attention_heads=2), projection_dim=16),
                   "zero-shot-image-classification", ["input_ids", "pixel_values", "attention_mask"],
                   ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"]),
    "wav2vec2": HfCase("Wav2Vec2ForCTC", "Wav2Vec2Config",
                       dict(vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=37, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2),
                       "automatic-speech-recognition", ["input_values"], ["logits"]),
    "whisper": HfCase("WhisperForConditionalGeneration", "WhisperConfig",
                      dict(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=16,
                           max_source_positions=16, max_target_positions=16, pad_token_id=1, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1),
                      "feature-extraction", ["input_features"], ["last_hidden_state"], flag=True, encoder=True),
    "t5": HfCase("T5ForConditionalGeneration", "T5Config",
                 dict(vocab_size=100, d_model=32, d_kv=16, d_ff=37, num_layers=1, num_heads=2,
                      decoder_start_token_id=0),
                 "feature-extraction", ["input_ids", "attention_mask"], ["last_hidden_state"], flag=True, encoder=True),
}


def save(name: str, directory: Path, **save_kwargs: Any) -> Path:
    """``CASES[name]`` built with seed 0 and saved to ``directory`` (save_pretrained)."""
    import transformers

    case = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, case.cls)(getattr(transformers, case.config)(**case.kwargs)).eval()
    model.save_pretrained(str(directory), **save_kwargs)
    return directory


def eager(name: str, directory: Path, feeds: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What transformers computes for Optimum's outputs of ``CASES[name]``, loaded back from ``directory``."""
    import transformers

    case = CASES[name]
    model = getattr(transformers, case.cls).from_pretrained(str(directory)).eval()
    part = model.get_encoder() if case.encoder else model
    with torch.no_grad():
        out = part(**feeds)
    return {k: out[k].numpy() for k in case.outputs}


def feeds_like(shapes: dict[str, tuple[list[int], str]], vocab: int, seed: int = 7) -> dict[str, torch.Tensor]:
    """Inputs of the given ONNX shapes and element types other than the export's own: ids anywhere in the
    vocabulary, a mask whose last row pads its tail, features from N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, kind) in shapes.items():
        if name == "attention_mask":
            mask = torch.ones(shape, dtype=torch.int64)
            mask[-1, -3:] = 0
            out[name] = mask
        elif name == "position_ids":
            out[name] = torch.arange(shape[-1]).expand(shape).contiguous()
        elif name == "token_type_ids":
            out[name] = torch.zeros(shape, dtype=torch.int64)
        elif kind == "int64":
            out[name] = torch.randint(0, vocab, shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g)
    return out


def copy_saved(saved: dict[str, Path], name: str, tmp_path: Path) -> Path:
    """A test's own copy of the saved directory ``saved[name]`` (module fixtures save once; tests edit copies)."""
    import shutil

    return Path(shutil.copytree(saved[name], tmp_path / name))
