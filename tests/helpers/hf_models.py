"""transformers architectures from tiny configs with random weights (nothing is downloaded)."""
from __future__ import annotations

import torch


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=37, max_position_embeddings=64)
    return BertModel(cfg).eval()


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False)
    return GPT2LMHeadModel(cfg).eval()


def tiny_decoder_gpt2(n_positions=16):
    """A 2-layer GPT-2 LM with its cache on (the multi-graph tests' decoder): vocabulary 96, pad and bos 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=96, n_positions=n_positions,
                     bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


WHISPER_MELS, WHISPER_SOURCE = 16, 16  # num_mel_bins, max_source_positions: input_features is 16 x 32 frames


def tiny_whisper():
    """A Whisper with 1 encoder and 2 decoder layers (the cache follows decoder_layers). init_std 0.3, seed 5:
    random weights whose greedy tokens differ from step to step (43, 39, 62, 95), so a wrong cache shows."""
    import transformers

    torch.manual_seed(5)
    cfg = transformers.WhisperConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, num_mel_bins=WHISPER_MELS,
                                     max_source_positions=WHISPER_SOURCE,
                                     max_target_positions=32, pad_token_id=1, bos_token_id=1, eos_token_id=2,
                                     decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None,
                                     init_std=0.3)
    return transformers.WhisperForConditionalGeneration(cfg).eval()


def tiny_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=37, num_labels=3)
    return ViTForImageClassification(cfg).eval()


def tiny_resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=4)
    model = ResNetForImageClassification(cfg)
    with torch.no_grad():  # non-trivial BatchNorm statistics so a missed fold would show
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def token_inputs(batch=2, seq=12, vocab=100):
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g),
            "attention_mask": torch.ones(batch, seq, dtype=torch.int64)}


def image_inputs(batch=2, size=32):
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))}
