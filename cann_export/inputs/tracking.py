"""Recording the inputs of a model's most recent forward call, so ``export`` can reuse them."""
from __future__ import annotations

import threading
import weakref
from typing import Any

_last_inputs: weakref.WeakKeyDictionary[Any, tuple[tuple, dict]] = weakref.WeakKeyDictionary()
_handles: dict[str, Any] = {}
_depth = threading.local()


def _detach(value: Any) -> Any:
    """Detached references, not copies: this runs on every forward call of a training loop, and export
    only needs the inputs' shapes, dtypes and (if nothing overwrote them) their values."""
    import torch

    if isinstance(value, tuple) and all(isinstance(x, torch.Tensor) for x in value):
        return tuple(x.detach() for x in value)
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, value)


class History:
    """What the calls of one model showed, beyond the last call: the fullest call (the most tensor inputs,
    the latest of those), every input seen, and each input's smallest and largest batch (axis 0). Inputs are
    keyed by keyword name, positional ones by their index (an int)."""

    __slots__ = ("batch", "fullest", "fullest_keys", "seen")

    def __init__(self) -> None:
        self.fullest: tuple[tuple, dict] | None = None
        self.fullest_keys: frozenset = frozenset()
        self.seen: set = set()  # every input any call passed
        self.batch: dict[Any, tuple[int, int]] = {}


_history: weakref.WeakKeyDictionary[Any, History] = weakref.WeakKeyDictionary()


def input_keys(args: tuple, kwargs: dict) -> dict[Any, Any]:
    """The tensor inputs of a call: {position or keyword: tensor} (None and non-tensors left out)."""
    import torch

    keys: dict[Any, Any] = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    keys.update((k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return keys


def _record(module: Any, args: tuple, kwargs: dict) -> None:
    tensors = input_keys(args, kwargs)
    if any(t.dim() and type(t.shape[0]) is not int for t in tensors.values()):
        return  # a call traced by torch.export (symbolic sizes): not the user's, and int() would specialise them
    call = (_detach(args), _detach(kwargs) if kwargs else {})
    _last_inputs[module] = call
    history = _history.get(module)
    if history is None:
        history = _history[module] = History()
    tensors = input_keys(*call)
    history.seen.update(tensors)
    if len(tensors) >= len(history.fullest_keys):
        history.fullest, history.fullest_keys = call, frozenset(tensors)
    for key, value in tensors.items():
        if value.dim():
            size = int(value.shape[0])
            low, high = history.batch.get(key, (size, size))
            history.batch[key] = (min(low, size), max(high, size))


def track(model: Any) -> Any:
    """Record the inputs of every forward call of ``model`` (its last call is kept). Returns ``model``."""
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        _record(module, args, kwargs)

    if not getattr(model, "_cann_export_tracked", False):
        model.register_forward_pre_hook(hook, with_kwargs=True)
        model._cann_export_tracked = True
    note_model(model)
    from ..backend import train_config

    train_config.on_tracked(model)  # cann.torch.config's training keys (mixed precision, ...)
    return model


def enable_global() -> None:
    """Record the inputs (positional and keyword) of every outermost module call in the process (nested
    calls are ignored). Recorded after the call, by a global forward hook: torch's global *pre*-hooks see
    positional arguments only."""
    from torch.nn.modules import module as nn_module

    if _handles:
        return

    def pre(module: Any, args: tuple) -> None:
        _depth.value = getattr(_depth, "value", 0) + 1

    def post(module: Any, args: tuple, *rest: Any) -> None:
        # (kwargs, output) after a forward; torch calls an always_call hook as (module, args, output) when
        # the forward raised: the depth still goes down, so the next top-level call is recorded
        depth = max(getattr(_depth, "value", 1) - 1, 0)
        _depth.value = depth
        if depth == 0 and len(rest) == 2:
            _record(module, args, rest[0] or {})
            note_model(module)

    _handles["pre"] = nn_module.register_module_forward_pre_hook(pre)
    _handles["post"] = nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True)


def disable_global() -> None:
    for handle in _handles.values():
        handle.remove()
    _handles.clear()


_models: list[weakref.ref] = []  # most recent last: modules tracked, moved to the device, or called


def note_model(module: Any) -> None:
    """Remember ``module`` as the one ``cann.torch.resume(path)`` restores when no model is passed (the
    export pipeline's private copies are not the user's model)."""
    if getattr(module, "_cann_export_private", False):
        return
    for ref in list(_models):
        if ref() is None or ref() is module:
            _models.remove(ref)
    _models.append(weakref.ref(module))
    del _models[:-8]


def tracked_model() -> Any:
    """The most recently tracked, moved (``.to("cann")``) or called outermost module with parameters
    (a loss module called after the model is not it)."""
    for ref in reversed(_models):
        module = ref()
        if module is not None and next(iter(module.parameters()), None) is not None:
            return module
    return None


def optimizers_of(model: Any) -> list[Any]:
    """The live optimizers that update ``model``'s parameters (found by a scan of the heap, once)."""
    import gc

    import torch

    params = {id(p) for p in model.parameters()}
    found = []
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer) and any(
                id(p) in params for group in obj.param_groups for p in group["params"]):
            found.append(obj)
    return found


def recorded_inputs(model: Any) -> tuple[tuple, dict] | None:
    return _last_inputs.get(model)


def recorded_history(model: Any) -> History | None:
    return _history.get(model)


def sole_optimizer(model: Any, what: str) -> Any:
    """The one live optimizer updating ``model`` (None when there is none); ``what`` names the caller in the
    error raised when several do."""
    from ..errors import OptionsError

    found = optimizers_of(model)
    if len(found) > 1:
        raise OptionsError(f"{what}: {len(found)} optimizers update the model; pass the one to use as optimizer=")
    return found[0] if found else None
