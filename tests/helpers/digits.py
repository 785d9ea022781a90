"""scikit-learn's bundled digits (8x8 images, 10 classes) and a small CNN trained on them in fp32."""
from __future__ import annotations

import functools

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


@functools.lru_cache(maxsize=1)
def split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(list(range(len(y))), test_size=0.25, random_state=0, stratify=y.numpy())
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


@functools.lru_cache(maxsize=1)
def trained_state() -> dict[str, torch.Tensor]:
    """The float model's weights (cached per process): trained with the articles' process-wide QAT switch
    suspended, since a test that turned it on may be the first to ask."""
    from cann_export.qat.auto import suspended

    with suspended():
        return _train_float()


def _train_float() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    x, y, _, _ = split()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _epoch in range(15):
        perm = torch.randperm(len(y))
        model.train()
        for i in range(0, len(y), 64):
            b = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(x[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def trained() -> DigitsCNN:
    model = DigitsCNN()
    model.load_state_dict(trained_state())
    return model.eval()


def accuracy_torch(model: nn.Module) -> float:
    _, _, x, y = split()
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean()) * 100


def accuracy_onnx(path) -> float:
    import onnxruntime as ort

    _, _, x, y = split()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    batch = sess.get_inputs()[0].shape[0]
    correct = 0
    for i in range(0, len(y), batch):  # the graph has the static batch of the example input
        xb, yb = x[i:i + batch], y[i:i + batch]
        if len(yb) < batch:
            xb = torch.cat([xb, xb[: batch - len(yb)].new_zeros(batch - len(yb), *xb.shape[1:])])
        pred = sess.run(None, {name: xb.numpy()})[0].argmax(1)[: len(yb)]
        correct += int((torch.from_numpy(pred) == yb).sum())
    return correct / len(y) * 100
