"""Forward arguments the inputs leave out, checked for whether they change the outputs: a parameter defaulting to
None that takes a tensor and is not an input is traced as None, a constant of the graph (LayoutLM's ``bbox``: boxes
of 0, logits at cosine 0.50 from eager on real boxes). Each such parameter with a known name gets a realistic dummy
and one eager forward on the example; where the outputs change, the manifest's warnings name it as frozen in the
graph. Unknown names are skipped: no dummy for them is realistic enough to say.

A Hugging Face directory's inputs are those its config declares (hf/inputs.dummy_specs: boxes with a 2-D position
table, segment ids with more than one type), as Optimum's graphs have them; None there is the value the task means
(GPT-2 without segment embeddings, audio without a padding mask), so its task models are not perturbed."""
from __future__ import annotations

import inspect
from typing import Any

# Names with a realistic dummy, and why None is not their value on real data. position_ids, head_mask and
# inputs_embeds are not here: None computes their usual value (positions, every head, the ids' embeddings).
KNOWN = {"bbox": "word boxes", "token_type_ids": "segment ids", "attention_mask": "padding"}


def candidates(model: Any, feed: dict[str, Any]) -> list[str]:
    """Known parameters of ``model.forward`` (a task wrapper's inner model's) defaulting to None, tensor-typed or
    unannotated, not in ``feed``."""
    target = getattr(model, "model", None) if _gathers(model) else model
    try:
        params = inspect.signature(target.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    return [p.name for p in params if p.name in KNOWN and p.name not in feed and p.default is None
            and _tensor_annotation(p.annotation)]


def _gathers(model: Any) -> bool:
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return False
    return any(p.kind == p.VAR_KEYWORD for p in params)


def _tensor_annotation(annotation: Any) -> bool:
    return annotation is inspect.Parameter.empty or "Tensor" in str(annotation)


def dummy(name: str, feed: dict[str, Any], seed: int) -> Any | None:
    """A realistic value of ``name`` for the example ``feed`` (its batch and sequence from the first integer 2-D
    input, else the first input's two leading axes); None when the feed has no such axes."""
    import torch

    from .boxes import BOX_SCALE, random_boxes
    from .tensors import padded_mask

    ref = next((t for t in feed.values() if t.dim() == 2 and not t.dtype.is_floating_point), None)
    ref = ref if ref is not None else next((t for t in feed.values() if t.dim() >= 2), None)
    if ref is None:
        return None
    batch, seq = int(ref.shape[0]), int(ref.shape[1])
    gen = torch.Generator().manual_seed(seed)
    if name == "bbox":
        return random_boxes((batch, seq, 4), BOX_SCALE, gen)
    if name == "token_type_ids":  # the second segment over each row's second half
        types = torch.zeros(batch, seq, dtype=torch.int64)
        types[:, seq // 2:] = 1
        return types
    mask = padded_mask((batch, seq), torch.int64, gen)
    mask[:, 0] = 1
    return mask


def changed_outputs(model: Any, feed: dict[str, Any], names: list[str], seed: int) -> dict[str, Any]:
    """{name: its dummy} of those ``names`` whose dummy changes ``model``'s outputs on ``feed`` (one eager forward
    each, no gradients, the RNG left as found). A forward that fails with the dummy skips that name."""
    import torch

    from .tensors import flatten_outputs

    if not names:
        return {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _, base = flatten_outputs(model(**feed))
        found = {}
        for name in names:
            value = dummy(name, feed, seed)
            if value is None:
                continue
            try:
                torch.manual_seed(seed)
                _, got = flatten_outputs(model(**feed, **{name: value}))
            except Exception:  # noqa: BLE001 - the model refuses this dummy (a table too small): nothing to say
                continue
            if len(got) != len(base) or any(_differs(a, b) for a, b in zip(got, base, strict=False)):
                found[name] = value
    return found


def _differs(a: Any, b: Any) -> bool:
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return True
    if not a.dtype.is_floating_point:
        return not torch.equal(a, b)
    scale = float(b.abs().max()) if b.numel() else 0.0
    return not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, scale))


def frozen_message(names: list[str]) -> list[str]:
    return [f"forward argument {n!r} ({KNOWN[n]}) changes the outputs but is not an input: the graph computes "
            f"with {n}=None, frozen in; pass it in the example inputs (or --example-inputs) to make it an input"
            for n in names]
