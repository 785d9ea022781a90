"""Sequence classifiers that pool an encoder-decoder's output at the end-of-sequence token (BART, mBART, PLBart,
LED, MVP, T5 ...ForSequenceClassification) refuse a batch whose rows hold different counts of it ("All examples
must have the same number of <eos> tokens"). Every input set drawn for such a model (the example, the random and
path variants, the shape sets) gets exactly one per row, where a tokenizer writes it: after the row's last
attended token. Any other drawn in a row becomes the next id. What the user gave (an example, --parity-data) and
a set whose rows already hold the same number of eos tokens are left as they are."""
from __future__ import annotations

from typing import Any

KEY = "eos_rows"  # LoadedModel.extras: the eos token id when the loader's model pools at it
DUMMY = "dummy inputs (config.json)"  # how the task's dummy inputs name their source (hf/inputs.TaskDummyInputs)


def eos_pooled(config: dict[str, Any], task: str) -> int | None:
    """The eos id of an encoder-decoder text classifier (config.json: an id inside its vocabulary), else None."""
    eos, vocab = config.get("eos_token_id"), config.get("vocab_size")
    if (task == "text-classification" and config.get("is_encoder_decoder") is True and type(eos) is int
            and type(vocab) is int and 0 <= eos < vocab):
        return eos
    return None


def drawn(sets: list[dict[str, Any]], labels: list[dict[str, Any]], example_drawn: bool) -> list[dict[str, Any]]:
    """The sets this tool drew: not the user's --parity-data, and the example only when it is the task's dummy."""
    return [s for s, label in zip(sets, labels, strict=True)
            if label["source"] != "parity_data" and (label["source"] != "example" or example_drawn)]


def place(ctx: Any, sets: list[dict[str, Any]]) -> None:
    """Put one eos per row into each set's ``input_ids`` (a new tensor in the set's dict: another set's view of
    the same storage is never written)."""
    eos = (ctx.loaded.extras or {}).get(KEY) if ctx.loaded is not None else None
    if eos is None:
        return
    import torch

    for feed in sets:
        ids = feed.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.numel() == 0:
            continue
        counts = (ids == eos).sum(dim=1)
        if bool((counts == counts[0]).all()) and int(counts[0]) > 0:
            continue  # already as the model takes it (an MNLI pair's three per row): left as drawn
        fixed = ids.masked_fill(ids == eos, eos + 1 if eos + 1 < _vocab(ctx, eos) else max(eos - 1, 0))
        mask = feed.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
            attended = (mask != 0).to(torch.int64) * torch.arange(1, ids.shape[1] + 1)
            last = (attended.argmax(dim=1)).clamp(min=0)
        else:
            last = torch.full((ids.shape[0],), ids.shape[1] - 1)
        fixed[torch.arange(ids.shape[0]), last] = eos
        feed["input_ids"] = fixed


def _vocab(ctx: Any, eos: int) -> int:
    hf = (ctx.loaded.extras or {}).get("hf") or {}
    highs = [s.get("high", 0) for s in hf.get("dummy_inputs", []) if s.get("name") == "input_ids"]
    return int(highs[0]) if highs else eos + 2
