"""Facade so user code reads as in the seed documents: ``import cann.torch``; ``cann.torch.export(...)``;
``cann.model_zoo.publish(...)`` (each submodule is imported when it is first named)."""
from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("torch", "model_zoo")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
