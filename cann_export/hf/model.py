"""A transformers model as the graph Optimum would export for a task: called with Optimum's input names,
returning Optimum's output names (``TaskModule``); loaded from a directory with ``from_pretrained`` offline
(local files only, no remote code unless trusted), weights materialised from the meta device."""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from ..errors import LoadError
from .tasks import TASKS, Task, outputs_of


def _module_base():
    import torch

    return torch.nn.Module


class TaskModule(_module_base()):  # type: ignore[misc]
    """``model(**inputs)`` with the fixed keywords a single-graph export needs (``use_cache=False``,
    ``return_dict=True``), its outputs picked by Optimum's names in Optimum's order."""

    def __init__(self, model: Any, output_names: list[str], fixed: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.config = getattr(model, "config", None)
        self.output_names = list(output_names)
        self.fixed = dict(fixed)

    def forward(self, **inputs: Any) -> dict[str, Any]:
        out = self.model(**inputs, **self.fixed)
        return {name: out[name] for name in self.output_names}


def forward_parameters(model: Any) -> list[str]:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return []


def task_module(model: Any, task: Task, arch: str, model_type: str) -> tuple[Any, dict[str, dict[int, str]]]:
    """(the TaskModule over ``model``, Optimum's outputs and their axes). ``model`` is the class the task
    runs: the encoder of an encoder-decoder and the base model of a head class for feature-extraction."""
    params = forward_parameters(model)
    fixed: dict[str, Any] = {}
    if "return_dict" in params:
        fixed["return_dict"] = True
    if "use_cache" in params:
        fixed["use_cache"] = False
    outputs = outputs_of(task, arch, model_type)
    return TaskModule(model, list(outputs), fixed), outputs


def for_task(model: Any, task: Task, arch: str) -> Any:
    """The part of a loaded ``arch`` model that ``task`` exports: itself, its encoder (feature-extraction of an
    encoder-decoder) or its base model (feature-extraction of a head class)."""
    if task.name != "feature-extraction":
        return model
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
        return model.get_encoder()
    from .tasks import EXTRA_FEATURE_CLASSES

    if arch in EXTRA_FEATURE_CLASSES:
        return model
    base = getattr(model, "base_model", model)
    return base if base is not None else model


def load_pretrained(directory: Path, arch: str, task: Task, config: dict[str, Any], safetensors: bool,
                    options: Any) -> Any:
    """``from_pretrained`` of the class that does ``task``: the directory's own class when it does it, else the
    task's Auto class (never a download; remote code only with --trust-remote-code)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from .tasks import _classes

    remote = "auto_map" in config
    encoder_decoder = bool(config.get("is_encoder_decoder"))
    own = remote is False and (task.mapping is None and (encoder_decoder or arch in _EXTRA())
                               or task.mapping is not None and arch in _classes(task.mapping))
    name = arch if own else task.auto_class
    cls = getattr(transformers, name, None)
    if cls is None:
        raise LoadError(f"this transformers ({transformers.__version__}) has no class {name} for config.json's "
                        f"architecture; upgrade transformers or pass another --task", path=directory / "config.json")
    if remote:
        _private_modules_cache()
    try:
        model = cls.from_pretrained(str(directory), local_files_only=True, trust_remote_code=bool(remote),
                                    use_safetensors=safetensors, dtype=torch.float32)
    except LoadError:
        raise
    except Exception as e:  # transformers' own refusal: name it with the directory
        raise LoadError(f"transformers could not load the directory as {name} ({type(e).__name__}: "
                        f"{_gist(e)}); check config.json matches the weights, or re-save with save_pretrained",
                        path=directory) from e
    return for_task(model.eval(), task, arch)


def _private_modules_cache() -> None:
    """Remote code is copied into transformers' modules cache before it is imported: a private temporary
    directory here (inside the load sandbox's own directory when confined; removed at exit), never the user's
    ~/.cache, which the sandbox may not write and a model directory must not populate."""
    import atexit
    import shutil
    import tempfile

    import transformers.dynamic_module_utils as dynamic

    if getattr(dynamic, "_cann_export_private", False):
        return
    path = tempfile.mkdtemp(prefix="cann-export-hf-modules-")
    atexit.register(shutil.rmtree, path, True)
    dynamic.HF_MODULES_CACHE = path
    dynamic._cann_export_private = True


def _EXTRA() -> dict[str, Any]:  # noqa: N802 - the table's name
    from .tasks import EXTRA_FEATURE_CLASSES

    return EXTRA_FEATURE_CLASSES


def _gist(e: BaseException) -> str:
    from ..errors import gist

    return gist(e, 300)


def is_pretrained(module: Any) -> bool:
    """A transformers PreTrainedModel (checked without importing transformers when the caller never did)."""
    import sys

    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel)


__all__ = ["TASKS", "TaskModule", "for_task", "load_pretrained", "task_module"]
