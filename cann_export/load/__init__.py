"""Loading models (paths, archives, checkpoints -> LoadedModel). The package is also ``cann_export.load``, the
public call that runs a bundle back: ``cann_export.load(BUNDLE)`` (a graph's runner, a multi-graph bundle's components
by name, a diffusers pipeline bundle's runner called like the pipeline: bundle/graph_runner.py), since a package
attribute of that name would be this module anyway."""
from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, bundle: Any, **options: Any) -> Any:
        from ..bundle.graph_runner import load

        return load(bundle, **options)


sys.modules[__name__].__class__ = _CallableModule
