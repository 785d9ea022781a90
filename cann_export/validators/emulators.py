"""One Emulator per graph and settings, shared by a graph's device checks (validators/parity.py check_graph,
bundle/rederive.py): the verdict at the example's shape, --fix-precision's trials and the other shapes' verdicts
read the weights once and round them once."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .precision import INF_NAN, Emulator

if TYPE_CHECKING:
    from ..atc.mixlists import MixLists

_SHARED: dict[str, Any] | None = None  # shared_emulators' graph, its weights and the Emulators made of it


@contextlib.contextmanager
def shared_emulators(model: Any, fed: dict[str, np.ndarray] | None = None) -> Iterator[None]:
    """Within the block, emulator_for(``model``, ...) gives one Emulator per (mode, overflow, deq_scale, lists),
    built on ``fed`` (fed_weights: the weights read once): the device verdict, --fix-precision's trials and the other
    shapes' verdicts of one graph share its weights and rounded weights (each built its own: CLIP-base's check held
    four copies of its weights, and converted them twice)."""
    global _SHARED
    outer, _SHARED = _SHARED, {"model": model, "fed": fed, "made": {}}
    try:
        yield
    finally:
        _SHARED = outer


def emulator_for(model: Any, mode: str, overflow: str = INF_NAN, deq_scale: str = "s19",
                 lists: MixLists | None = None) -> Emulator:
    """The shared Emulator of ``model`` under these settings (shared_emulators), else a new one."""
    import json

    shared = _SHARED
    if shared is None or shared["model"] is not model:
        return Emulator(model, mode, overflow, deq_scale, lists)
    key = (mode, overflow, deq_scale, None if lists is None else json.dumps(lists.to_dict(), sort_keys=True,
                                                                             default=str))
    if key not in shared["made"]:
        made = shared["made"][key] = Emulator(model, mode, overflow, deq_scale, lists, fed=shared["fed"])
        shared["fed"] = made.weights_read
    return shared["made"][key]
