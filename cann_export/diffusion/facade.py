"""The article's flow on a pipeline under ``cann.torch.enable()``: diffusers' pipelines have no ``parameters()``
(the article's ``AdamW(pipeline.parameters())``), so while enabled a pipeline gives every model part's parameters,
with a warning naming the one-line form that trains the denoiser only. Installed only when diffusers is already
imported (no import at enable()); removed by disable()."""
from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any

_INSTALLED: list[Any] = []


def _parameters(self: Any, recurse: bool = True) -> Iterator[Any]:
    from .table import PIPELINES

    name = type(self).__name__
    denoiser = PIPELINES.get(name, ((), "transformer"))[1]
    warnings.warn(f"a diffusers {name} has no parameters(); under cann.torch.enable() it gives every model "
                  f"part's (text encoders, {denoiser}, vae). To train the denoiser only: pipe.{denoiser}.parameters()",
                  stacklevel=2)
    for part in self.components.values():
        if hasattr(part, "parameters") and hasattr(part, "named_modules"):
            yield from part.parameters(recurse)


def install() -> None:
    module = sys.modules.get("diffusers")
    cls = getattr(module, "DiffusionPipeline", None) if module is not None else None
    if cls is None or _INSTALLED or hasattr(cls, "parameters"):
        return
    cls.parameters = _parameters
    _INSTALLED.append(cls)


def uninstall() -> None:
    while _INSTALLED:
        cls = _INSTALLED.pop()
        if getattr(cls, "parameters", None) is _parameters:
            del cls.parameters
