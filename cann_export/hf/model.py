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
        self.main_input_name = getattr(model, "main_input_name", None)  # read as a transformers model (masks int64)
        self.output_names = list(output_names)
        self.fixed = dict(fixed)

    def forward(self, **inputs: Any) -> dict[str, Any]:
        out = self.model(**inputs, **self.fixed)
        missing = [n for n in self.output_names if n not in out or out[n] is None]
        if missing:
            raise KeyError(f"{type(self.model).__name__} returns no {', '.join(missing)} (it returns "
                           f"{', '.join(k for k in out.keys() if out[k] is not None)}), the task's outputs; pass "
                           "--task with a task this class does")
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
                    options: Any, stored: int | None = None) -> Any:
    """``from_pretrained`` of the class that does ``task``: the directory's own class when it does it, else the
    task's Auto class (never a download; remote code only with --trust-remote-code). With safetensors, a config
    describing more parameters than the files hold (``stored`` elements; counted here when None) is refused
    first."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from ..load.torchvision_pair import hide_broken_torchvision

    hide_broken_torchvision()  # before transformers reads whether torchvision is there
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
    elif safetensors:
        if stored is None:  # the elements the weight files hold (their headers, checked again here)
            from .weights import stored_elements, weight_files

            stored = stored_elements(weight_files(directory, bool(getattr(options, "trust_pickle", False)))[1])
        _check_size(cls, directory, stored)
    try:
        model, info = cls.from_pretrained(str(directory), local_files_only=True, trust_remote_code=bool(remote),
                                          use_safetensors=safetensors, dtype=torch.float32, output_loading_info=True)
    except LoadError:
        raise
    except Exception as e:  # transformers' own refusal: name it with the directory
        raise LoadError(f"transformers could not load the directory as {name} ({type(e).__name__}: "
                        f"{_gist(e)}); check config.json matches the weights, or re-save with save_pretrained",
                        path=directory) from e
    from .tasks import outputs_of

    # a base model's pooler is untrained in a head checkpoint; only feature-extraction without pooler_output skips it
    pooler_unused = task.name == "feature-extraction" and \
        "pooler_output" not in outputs_of(task, arch, str(config.get("model_type")))
    _check_missing(info, name, directory, pooler_unused)
    return for_task(_eager_experts(model).eval(), task, arch)


def _eager_experts(model: Any) -> Any:
    """A mixture-of-experts model (Mixtral, Qwen-MoE, ...) on transformers' ``batched_mm`` experts: each routed
    token gathers its experts' weights, a graph with no data-dependent control flow. The default ``grouped_mm``
    runs a custom op and ``histc``, which no ONNX exporter converts; the ``eager`` loop runs only the experts the
    example routed to, so a trace of it is wrong on other inputs."""
    can = getattr(type(model), "_can_set_experts_implementation", None)
    if callable(can) and can() and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("batched_mm")
    return model


def _check_missing(info: Any, name: str, directory: Path, pooler_unused: bool) -> None:
    """Refuse a model some of whose weights are not in the files (renamed tensors, a shard the index leaves out, a
    head the checkpoint never had): transformers initialises those at random and only warns, and the graph would
    compute with them. A base model's pooler is the exception when the task does not export ``pooler_output``
    (feature-extraction of a fill-mask or classifier checkpoint: RoBERTa's, ViT's have no trained pooler)."""
    missing = sorted(info.get("missing_keys") or []) if isinstance(info, dict) else []
    if pooler_unused:  # a classifier head reads the pooler: never skipped there
        missing = [k for k in missing if not (k.startswith("pooler.") or ".pooler." in k)]
    if missing:
        raise LoadError(f"{len(missing)} weight(s) of {name} are not in the directory's weight files "
                        f"({shown_keys(missing)}): "
                        "transformers would fill them with random values, and the exported graph would compute with "
                        "them. Pass the --task the checkpoint was trained for (its head), or re-save the model with "
                        "save_pretrained", path=directory)


SIZE_SLACK = 1_000_000  # parameters a model may have beyond its files (e.g. a re-initialised buffer-like table)


def shown_keys(keys: list[str]) -> str:
    """The first weight names of ``keys`` and how many more, for a message."""
    return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")


def past_the_weights(needed: int, stored: int) -> bool:
    """Whether a model of ``needed`` elements is far larger than the ``stored`` elements of its weight files."""
    return needed > stored + max(SIZE_SLACK, stored // 100)


def _check_size(cls: Any, directory: Path, stored: int) -> None:
    """Refuse a config.json that describes a larger model than its weights hold (``stored`` elements), before
    transformers allocates the difference as newly initialised weights: the model is built on the meta device
    (no memory) and its parameters counted."""
    import torch
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
        with torch.device("meta"):
            model = cls.from_config(config) if cls.__name__.startswith("Auto") else cls._from_config(config)
    except Exception as e:  # noqa: BLE001 - transformers' refusal of the config, named with the file
        raise LoadError(f"transformers cannot build a model from config.json ({type(e).__name__}: {_gist(e)}); "
                        "fix the config or re-save the model with save_pretrained",
                        path=directory / "config.json") from e
    needed = sum(p.numel() for p in model.parameters())
    if past_the_weights(needed, stored):
        raise LoadError(f"config.json describes a model of {needed:,} parameters but the weight files hold {stored:,}; "
                        "the config does not belong to these weights (the rest would be random). Restore the "
                        "model's own config.json or re-save the model with save_pretrained",
                        path=directory / "config.json")


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
