"""The models of bench_vs_optimum.py, from configs with random weights (nothing is downloaded), written with
``save_pretrained`` into ``OUT/NAME/``; ``OUT/NAME.pt2`` is a positional torch.export capture of the same
model at the same shapes (the .pt2 path, for a checkout whose ``cann-export DIR`` is not there yet).

Run as ``python optimum_models.py OUT NAME[,NAME...]``; prints one JSON line of facts per model."""
from __future__ import annotations

import json
import sys
from pathlib import Path

SEQ = 128
IMAGE = 224

# name -> (Optimum task, input names of the .pt2 capture, a one-line description)
MODELS = {
    "distilbert": ("text-classification", ["input_ids", "attention_mask"], "DistilBERT, 4 layers, dim 256, seq 128"),
    "vit": ("image-classification", ["pixel_values"], "ViT-small/16, 12 layers, dim 384, 224x224"),
    "gpt2": ("text-generation-with-past", ["input_ids", "attention_mask"], "GPT-2 small, 12 layers, dim 768"),
}


def build(name: str):
    # this venv's torchvision wheel does not load against the CPU torch, and transformers imports it where it is
    # installed; none of these models needs it
    sys.modules.setdefault("torchvision", None)
    import torch

    torch.manual_seed(0)
    if name == "distilbert":
        from transformers import DistilBertConfig, DistilBertForSequenceClassification

        cfg = DistilBertConfig(n_layers=4, dim=256, n_heads=4, hidden_dim=1024, vocab_size=30522, num_labels=2)
        model = DistilBertForSequenceClassification(cfg)
        g = torch.Generator().manual_seed(1)
        inputs = (torch.randint(0, 30522, (1, SEQ), generator=g), torch.ones(1, SEQ, dtype=torch.int64))
    elif name == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                        image_size=IMAGE, patch_size=16, num_labels=1000)
        model = ViTForImageClassification(cfg)
        inputs = (torch.randn(1, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1)),)
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config())
        g = torch.Generator().manual_seed(1)
        inputs = (torch.randint(0, 50257, (1, SEQ), generator=g), torch.ones(1, SEQ, dtype=torch.int64))
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return model.eval(), inputs


def positional(model, names: list[str]):
    """``model`` behind positional inputs and a tuple of tensor outputs, as torch.export needs for a .pt2 that
    cann-export loads (its keyword-input .pt2 support is another branch's work)."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(names, args, strict=True)), use_cache=False)
            return tuple(v for v in out.values() if isinstance(v, torch.Tensor))

    return Positional()


def main() -> None:
    import torch

    out, names = Path(sys.argv[1]), sys.argv[2].split(",")
    for name in names:
        model, inputs = build(name)
        model.save_pretrained(out / name)
        task, input_names, about = MODELS[name]
        if not task.endswith("-with-past"):  # a decoder with past is no single positional graph
            with torch.no_grad():
                ep = torch.export.export(positional(model, input_names), inputs)
            torch.export.save(ep, str(out / f"{name}.pt2"))
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"name": name, "task": task, "about": about, "weights_bytes": weights,
                          "inputs": {n: list(t.shape) for n, t in zip(input_names, inputs, strict=True)}}))


if __name__ == "__main__":
    main()
