"""Attention masks the TorchScript tracer can record, on the transformers releases that build them with vmap.

transformers 4.53-4.57 build every model's causal / padding / sliding-window mask with ``torch.vmap``
(``masking_utils.sdpa_mask_recent_torch``, which ``eager_mask`` calls too). The tracer cannot record vmap
("RuntimeError: unordered_map::at"), so each decoder's trace failed there and capture fell back to dynamo: GPT-2
small took 16 s a graph instead of ~1.5 s on those releases. While tracing, ``sdpa_mask`` is swapped for one that
evaluates the same mask function once on broadcast index tensors (batch x 1 x query x key), as transformers 5
does by default and Optimum's ModelPatcher does for these releases; the originals come back after. Releases
without ``sdpa_mask_recent_torch`` (before 4.53, 5.x) are left alone, and transformers is never imported here: a
model that did not import its masking module builds no such mask."""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

_LOCK = threading.RLock()  # the swap is process-wide: one trace at a time holds it (a nested one restores in turn)


@contextlib.contextmanager
def traceable_masks() -> Iterator[None]:
    """Within the block, transformers' vmap mask builder is replaced by a broadcasting one (see the module's doc)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not callable(getattr(masking, "sdpa_mask_recent_torch", None)):
        yield
        return
    registry = getattr(masking, "ALL_MASK_ATTENTION_FUNCTIONS", None)
    with _LOCK:
        original, registered = masking.sdpa_mask, _registered(registry, "sdpa")
        swapped = _broadcast_sdpa_mask(masking)
        masking.sdpa_mask = swapped  # eager_mask reads the module's sdpa_mask when called
        if registered is not None:
            registry.register("sdpa", swapped)
        try:
            yield
        finally:
            masking.sdpa_mask = original
            if registered is not None:
                registry.register("sdpa", registered)


def _registered(registry: Any, name: str) -> Any:
    mapping = getattr(registry, "_global_mapping", None)
    return mapping.get(name) if isinstance(mapping, dict) and callable(getattr(registry, "register", None)) else None


def _broadcast_sdpa_mask(masking: Any) -> Any:
    """``sdpa_mask_recent_torch`` with the vmap replaced by broadcasting: the same padding, the same skip rule (never
    taken while tracing), the same mask function, called once on index tensors."""
    import torch

    def sdpa_mask(batch_size: int, cache_position: torch.Tensor, kv_length: int, kv_offset: int = 0,
                  mask_function: Any = None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
                  allow_is_causal_skip: bool = True, **kwargs: Any) -> torch.Tensor | None:
        mask_function = mask_function or masking.causal_mask_function
        q_length = cache_position.shape[0]
        padding_mask = masking.prepare_padding_mask(attention_mask, kv_length, kv_offset, _slice=False)
        if allow_is_causal_skip and masking._ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, kv_offset,
                                                                     local_size):
            return None
        if padding_mask is not None:
            mask_function = masking.and_masks(mask_function, masking.padding_mask_function(padding_mask))
        device = cache_position.device
        batch = torch.arange(batch_size, device=device)[:, None, None, None]
        head = torch.arange(1, device=device)[None, :, None, None]
        query = cache_position[None, None, :, None]
        key = (torch.arange(kv_length, device=device) + kv_offset)[None, None, None, :]
        return mask_function(batch, head, query, key).expand(batch_size, -1, q_length, kv_length)

    return sdpa_mask
