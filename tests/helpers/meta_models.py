"""Factories for the meta-device load tests (importable as ``helpers.meta_models:NAME``)."""
from __future__ import annotations

import torch
from torch import nn


def tiny_gpt2_lm():
    """Tied input/output embeddings and non-persistent buffers: the cases assign-loading must keep right."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, use_cache=False)
    return GPT2LMHeadModel(cfg).eval()


def tiny_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=37, max_position_embeddings=32)
    return BertModel(cfg).eval()


class ReadsItsWeights(nn.Module):
    """Computes a Python float from its freshly initialised weights, which the meta device cannot."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.scale = 1.0 + float(self.lin.weight.abs().sum()) * 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def reads_its_weights():
    return ReadsItsWeights()


class KeepsADerivedTensor(nn.Module):
    """Keeps a plain tensor attribute computed from its weight in ``__init__`` (not a buffer: no state_dict key)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.scale = self.lin.weight.detach().abs().mean() * 0 + 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def keeps_a_derived_tensor():
    return KeepsADerivedTensor()
