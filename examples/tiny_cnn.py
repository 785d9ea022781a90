"""The bundled example model: a small CNN with Conv+BatchNorm and Dropout (both stripped on export).

Regenerate its weights with ``python examples/tiny_cnn.py`` (deterministic: seed 0).
"""
from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width * 2, 3, stride=2, padding=1), nn.BatchNorm2d(width * 2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(width * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.features(x).flatten(1)))


def build_weights(path: str = "examples/tiny_cnn.safetensors") -> None:
    from safetensors.torch import save_model

    torch.manual_seed(0)
    model = TinyCNN()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so folding them is visible in the graph
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    save_model(model, path)


if __name__ == "__main__":
    build_weights()
