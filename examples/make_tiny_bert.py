"""Regenerate examples/tiny-bert/: a tiny BertForSequenceClassification saved with ``save_pretrained``
(seeded random weights, nothing downloaded), the Hugging Face directory of the README's quickstart.

    python examples/make_tiny_bert.py
"""
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

OUT = Path(__file__).resolve().parent / "tiny-bert"


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=2)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
