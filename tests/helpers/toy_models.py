"""Small hand-made models used by the tests (importable as ``helpers.toy_models:NAME``)."""
from __future__ import annotations

import torch
from torch import nn


class ConvBnDropout(nn.Module):
    """Conv+BN pairs both inside a Sequential and as plain attributes, plus Dropout."""

    def __init__(self, channels: int = 8, num_classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(0.5)
        self.drop2d = nn.Dropout2d(0.3)
        self.head = nn.Linear(channels, num_classes)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop2d(self.stem(x))
        x = torch.relu(self.bn(self.conv(x)))
        return self.head(self.drop(x.mean(dim=(2, 3))))


class TwoInputs(nn.Module):
    """Named float and token-id inputs and a dict of two outputs."""

    def __init__(self, vocab: int = 50, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.norm(self.embed(input_ids) + self.proj(features))
        return {"hidden": h, "pooled": h.mean(dim=1)}


class MLP(nn.Module):
    def __init__(self, d_in: int = 12, hidden: int = 32, d_out: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_mlp(hidden: int = 32) -> MLP:
    torch.manual_seed(0)
    return MLP(hidden=hidden)


class SegmentedTokens(nn.Module):
    """Token ids and optional segment ids (``token_type_ids=None``: every token in segment 0), which change the
    outputs: exported with input_ids only, the segments are frozen into the graph."""

    def __init__(self, vocab: int = 50, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.segments = nn.Embedding(2, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.head((self.embed(input_ids) + self.segments(token_type_ids)).mean(dim=1))
