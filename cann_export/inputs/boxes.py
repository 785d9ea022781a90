"""Bounding-box inputs (LayoutLM's ``bbox``: int64 ``[batch, sequence, 4]`` as x0, y0, x1, y1): every draw a
valid box, x0 <= x1 and y0 <= y1 within 0..``high``, as a document's normalised word boxes are (0..1000). Drawn
coordinate by coordinate they would give negative widths, which LayoutLM's width and height tables cannot index."""
from __future__ import annotations

from typing import Any

BOX_INPUTS = ("bbox",)
BOX_SCALE = 1000  # LayoutLM-style models normalise page coordinates to 0..1000


def is_boxes(name: str, t: Any) -> bool:
    """``t`` is the integer box input ``name`` (its last axis the 4 coordinates)."""
    return name in BOX_INPUTS and t.dim() >= 1 and t.shape[-1] == 4 and not t.dtype.is_floating_point


def box_high(config_max: Any) -> int:
    """The largest coordinate: 1000, below a smaller 2-D position table (``max_2d_position_embeddings``)."""
    return min(BOX_SCALE, int(config_max) - 1) if isinstance(config_max, int) and config_max > 1 else BOX_SCALE


def random_boxes(shape: tuple[int, ...], high: int, gen: Any, dtype: Any = None) -> Any:
    """Seeded valid boxes of ``shape`` (last axis 4) with coordinates in 0..``high``."""
    import torch

    corners = torch.randint(0, max(1, high) + 1, (*shape[:-1], 2, 2), generator=gen, dtype=torch.int64)
    low, top = corners.min(dim=-1).values, corners.max(dim=-1).values  # [..., (x, y)]
    boxes = torch.stack([low[..., 0], low[..., 1], top[..., 0], top[..., 1]], dim=-1)
    return boxes.to(dtype or torch.int64)
