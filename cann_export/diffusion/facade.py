"""The article's flow on a pipeline under ``cann.torch.enable()``: ``pipe.to("cann")`` (diffusers parses the device
itself, so the ``cann`` name is given to its ``to`` as to torch's), and ``parameters()``, which diffusers'
pipelines lack (the article's ``AdamW(pipeline.parameters())``): while enabled a pipeline gives every model part's
parameters, with a warning naming the one-line form that trains the denoiser only (diffusers' own
``pipe.parameters`` dict stays what it was). Installed only when diffusers
is already imported (no import at enable()); removed by disable()."""
from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any

_INSTALLED: list[tuple[Any, Any, Any]] = []  # (the pipeline class, its own ``parameters`` and ``to``)


class CallableParameters(dict):
    """diffusers' ``pipe.parameters`` (a property: the dict of the pipeline's optional init arguments, kept as is),
    callable as ``nn.Module.parameters()`` is: every model part's parameters, with a warning."""

    def __init__(self, values: dict[str, Any], pipe: Any):
        super().__init__(values)
        self.pipe = pipe

    def __call__(self, recurse: bool = True) -> Iterator[Any]:
        from .table import PIPELINES

        name = type(self.pipe).__name__
        denoiser = PIPELINES.get(name, ((), "transformer"))[1]
        warnings.warn(f"a diffusers {name} has no parameters() (its .parameters is a dict of init arguments); under "
                      f"cann.torch.enable() it gives every model part's (text encoders, {denoiser}, vae). To train "
                      f"the denoiser only: pipe.{denoiser}.parameters()", stacklevel=2)
        return self._all(recurse)

    def _all(self, recurse: bool) -> Iterator[Any]:
        for part in self.pipe.components.values():
            if hasattr(part, "parameters") and hasattr(part, "named_modules"):
                yield from part.parameters(recurse)


def install() -> None:
    from ..backend.device_alias import _method_to

    module = sys.modules.get("diffusers")
    cls = getattr(module, "DiffusionPipeline", None) if module is not None else None
    own = cls.__dict__.get("parameters") if cls is not None else None
    if cls is None or _INSTALLED or not isinstance(own, property):
        return
    _INSTALLED.append((cls, own, cls.__dict__["to"]))
    cls.parameters = property(lambda self: CallableParameters(own.fget(self), self), doc=own.__doc__)
    cls.to = _method_to(cls.__dict__["to"])


def uninstall() -> None:
    while _INSTALLED:
        cls, parameters, to = _INSTALLED.pop()
        cls.parameters = parameters
        cls.to = to
