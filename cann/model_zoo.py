"""``cann.model_zoo``: the registry as the seeds spell it (``from cann.model_zoo import load_model``)."""
from __future__ import annotations

from cann_export.model_zoo.zoo_api import gc, list_models, load_model, publish, pull, set_alias, show, verify
from cann_export.model_zoo.zoo_errors import ZooConflictError, ZooError, ZooIntegrityError
from cann_export.model_zoo.signing import keygen

__all__ = ["ZooConflictError", "ZooError", "ZooIntegrityError", "gc", "keygen", "list_models", "load_model",
           "publish", "pull", "set_alias", "show", "verify"]
