"""The article's flow on a pipeline under ``cann.torch.enable()``: ``pipe.to("cann")`` (diffusers parses the device
itself, so the ``cann`` name is given to its ``to`` as to torch's), and ``parameters()``, which diffusers'
pipelines lack (the article's ``AdamW(pipeline.parameters())``): while enabled a pipeline gives every model part's
parameters, with a warning naming the one-line form that trains the denoiser only (diffusers' own
``pipe.parameters`` dict stays what it was). Installed when diffusers'
pipeline module is imported (now, or later through an import hook: enable() imports nothing); removed by
disable()."""
from __future__ import annotations

import importlib.abc
import importlib.util
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
        from ..diffusion.known_pipelines import PIPELINES

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


PIPELINE_MODULE = "diffusers.pipelines.pipeline_utils"


class _WhenImported(importlib.abc.MetaPathFinder):
    """Installs on diffusers' pipeline class once its module is imported (after enable(): no import here)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != PIPELINE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _patch(getattr(module, "DiffusionPipeline", None))

        loader.exec_module = exec_module
        return spec


_FINDER = _WhenImported()


def install() -> None:
    module = sys.modules.get(PIPELINE_MODULE)
    if module is not None:
        _patch(getattr(module, "DiffusionPipeline", None))
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _patch(cls: Any) -> None:
    from .device_alias import _method_to

    own = cls.__dict__.get("parameters") if cls is not None else None
    if cls is None or _INSTALLED or not isinstance(own, property):
        return
    _INSTALLED.append((cls, own, cls.__dict__["to"]))
    cls.parameters = property(lambda self: CallableParameters(own.fget(self), self), doc=own.__doc__)
    cls.to = _method_to(cls.__dict__["to"])


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    while _INSTALLED:
        cls, parameters, to = _INSTALLED.pop()
        cls.parameters = parameters
        cls.to = to
