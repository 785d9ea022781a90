"""The model zoo: a registry CI/CD deploy steps can trust (atomic, immutable, verified); a local
directory + SQLite index by default, the same layout on S3 (fsspec) for teams.

    from cann.model_zoo import load_model, publish
    publish(model=module, name="resnet", metadata={"license": "apache-2.0", "task": "image-classification"})
    model = load_model("resnet", framework="pytorch")
"""
from __future__ import annotations

from typing import Any

from .zoo_errors import ZooConflictError, ZooError, ZooIntegrityError

__all__ = ["ZooConflictError", "ZooError", "ZooIntegrityError", "gc", "keygen", "list_models", "load_model",
           "open_store", "publish", "pull", "set_alias", "show", "verify"]


def __getattr__(name: str) -> Any:
    if name in ("gc", "list_models", "load_model", "open_store", "publish", "pull", "set_alias", "show", "verify"):
        from . import zoo_api as api

        return getattr(api, name)
    if name == "keygen":
        from .signing import keygen

        return keygen
    raise AttributeError(f"module 'cann_export.model_zoo' has no attribute {name!r}")
