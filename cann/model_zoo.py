"""``cann.model_zoo``: the registry as the seeds spell it (``from cann.model_zoo import load_model``)."""
from __future__ import annotations

from cann_export.model_zoo.api import list_models, load_model, publish, pull, set_alias, show, verify
from cann_export.model_zoo.errors import ZooConflictError, ZooError, ZooIntegrityError

__all__ = ["ZooConflictError", "ZooError", "ZooIntegrityError", "list_models", "load_model", "publish", "pull",
           "set_alias", "show", "verify"]
