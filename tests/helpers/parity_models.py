"""Models that a kind parity check lets through: data-dependent branches, NaN or constant outputs."""
from __future__ import annotations

import torch


class Branchy(torch.nn.Module):
    """`if x.sum() > 0`: dynamo refuses the data-dependent branch, tracing keeps one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # the traced branch for positive examples
            return self.lin(x) * 2
        return self.lin(x) - 3


def nan_weights() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def constant_output() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(0.5)
    return model


class Overflow(torch.nn.Module):
    """Finite in fp32, inf in fp16: exp of values past 11."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.exp(self.lin(x) * 0 + x.abs() * 4 + 8)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)
