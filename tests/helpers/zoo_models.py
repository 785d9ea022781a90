"""Models and files for the model zoo tests (importable as ``helpers.zoo_models:NAME``)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class TiedLM(nn.Module):
    """A tiny language model whose output projection shares the embedding matrix (tied weights)."""

    def __init__(self, vocab: int = 40, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(input_ids)))


class Wide(nn.Module):
    """Plain stack of Linear layers, sized by ``width`` and ``depth`` (used for the large benchmark model)."""

    def __init__(self, width: int = 32, depth: int = 2):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def write_weights(path: Path, seed: int, n: int = 64) -> Path:
    """A small safetensors file whose bytes depend on ``seed`` (numpy only: no torch needed)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file({"layers.0.weight": rng.standard_normal((n, n)).astype("float32"),
               "layers.0.bias": rng.standard_normal(n).astype("float32")}, str(path))
    return path
