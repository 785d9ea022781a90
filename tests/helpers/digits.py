"""scikit-learn's bundled digits (8x8 images, 10 classes) and two models trained on them in fp32: a small
BatchNorm CNN and a transformers ViT (a real architecture from a small config)."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

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


def digits_vit() -> nn.Module:
    """transformers' ViTForImageClassification on the 8x8 digits: 2x2 patches (16 tokens and a [CLS]),
    hidden 32, 2 layers, 2 heads; random weights (the ``--model-class`` factory of the CLI tests)."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=10)
    return ViTForImageClassification(cfg)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny matrices train fastest on one thread, which also cannot oversubscribe cores shared with other
    workers (the ViT's training: 7 s of CPU on one thread, 168 s on two on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def trained_vit_state() -> dict[str, torch.Tensor]:
    """The float ViT's weights (cached per process, trained with the QAT switch suspended, as the CNN's):
    20 epochs of AdamW with a one-cycle schedule, about 5 s of one CPU core."""
    from cann_export.qat.auto import suspended

    with suspended(), one_thread():
        torch.manual_seed(0)
        model = digits_vit()
        x, y, _, _ = split()
        epochs, batch = 20, 128
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, pct_start=0.2,
                                                    total_steps=epochs * -(-len(y) // batch))
        model.train()
        for _epoch in range(epochs):
            perm = torch.randperm(len(y))
            for i in range(0, len(y), batch):
                b = perm[i:i + batch]
                loss = nn.functional.cross_entropy(model(pixel_values=x[b]).logits, y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
        return {k: v.clone() for k, v in model.state_dict().items()}


def trained_vit() -> nn.Module:
    model = digits_vit()
    model.load_state_dict(trained_vit_state())
    return model.eval()


def predictions_torch(model: nn.Module) -> torch.Tensor:
    _, _, x, _ = split()
    with torch.no_grad():
        out = model.eval()(x)
    return getattr(out, "logits", out).argmax(1)  # a transformers model returns an output object


def accuracy_torch(model: nn.Module) -> float:
    return percent_correct(predictions_torch(model))


def predictions_onnx(path) -> torch.Tensor:
    """The test split's classes by the ONNX graph at ``path`` in onnxruntime (its first output: the logits)."""
    import onnxruntime as ort

    _, _, x, y = split()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    batch = sess.get_inputs()[0].shape[0]
    preds = []
    for i in range(0, len(y), batch):  # the graph has the static batch of the example input
        xb = x[i:i + batch]
        if len(xb) < batch:
            xb = torch.cat([xb, xb.new_zeros(batch - len(xb), *xb.shape[1:])])
        preds.append(torch.from_numpy(sess.run(None, {name: xb.numpy()})[0].argmax(1)[: len(y) - i]))
    return torch.cat(preds)


def accuracy_onnx(path) -> float:
    return percent_correct(predictions_onnx(path))


def percent_correct(predictions: torch.Tensor) -> float:
    """Accuracy in percent of predicted classes of the test split."""
    y = split()[3]
    return int((predictions == y).sum()) / len(y) * 100
