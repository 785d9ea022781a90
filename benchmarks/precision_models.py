"""The benchmark's model that real fp16 breaks (benchmarks never import from tests/: a copy of the
calibration suite's reduction-overflow case, seeded the same way)."""
from __future__ import annotations

import torch
from torch import nn


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
    """``(model, inputs, the module where fp16 first diverges)``."""
    x = torch.randn(2, 1300, generator=torch.Generator().manual_seed(3)) * 30
    return ReductionOverflow().eval(), {"x": x}, "energy"
