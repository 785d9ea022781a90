"""``cann`` as a name of the ``npu`` device wherever users pass a device: ``Tensor.to("cann")``,
``Module.to("cann:0")``, ``device="cann"`` in the factory functions and ``Tensor.new_*``,
``torch.set_default_device``. Results carry the real device (``npu:0``).

torch's C++ device parser knows one name for PrivateUse1 (``npu``, as npu-sim and torch_npu name it),
so ``torch.device("cann")`` itself stays an error; ``cann.torch.device("cann:0")`` gives the
``torch.device`` to pass around. Installed by ``cann.torch.enable()``, removed by ``disable()``.
"""
from __future__ import annotations

import functools
from typing import Any

ALIAS = "cann"
FACTORIES = ("empty", "empty_like", "empty_strided", "empty_permuted", "zeros", "zeros_like", "ones",
             "ones_like", "full", "full_like", "rand", "rand_like", "randn", "randn_like", "randint",
             "randint_like", "randperm", "arange", "range", "linspace", "logspace", "eye", "tensor",
             "as_tensor", "asarray", "scalar_tensor", "tril_indices", "triu_indices", "normal",
             "hann_window", "hamming_window", "bartlett_window", "blackman_window", "kaiser_window",
             "set_default_device")
TENSOR_METHODS = ("to", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor")
_saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)


def real_name(device: Any) -> Any:
    """``"cann"``/``"cann:N"`` as the PrivateUse1 device's own name; anything else unchanged."""
    if isinstance(device, str) and device.startswith(ALIAS) and (len(device) == 4 or device[4] == ":"):
        import torch

        return torch._C._get_privateuse1_backend_name() + device[4:]
    return device


def device(spec: Any = ALIAS) -> Any:
    """A ``torch.device`` for ``"cann"``, ``"cann:0"``, ``"npu"``, ``0``, ..."""
    import torch

    if isinstance(spec, int):
        return torch.device(torch._C._get_privateuse1_backend_name(), spec)
    return torch.device(real_name(spec))


def _first_arg_is_device(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = (real_name(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = real_name(kwargs["device"])
        return fn(*args, **kwargs)
    return wrapper


def _device_kwarg(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        d = kwargs.get("device")
        if isinstance(d, str):
            kwargs["device"] = real_name(d)
        return fn(*args, **kwargs)
    return wrapper


def _method_to(fn: Any) -> Any:
    """``x.to("cann")``: the device may be the first argument after self, or ``device=``."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = (real_name(args[0]), *args[1:])
        d = kwargs.get("device")
        if isinstance(d, str):
            kwargs["device"] = real_name(d)
        return fn(self, *args, **kwargs)
    return wrapper


def _module_to(fn: Any) -> Any:
    """``Module.to("cann")`` / ``Module.npu()``; the module is remembered for ``cann.torch.resume(path)``,
    and a module moved to the device gets ``cann.torch.config``'s training keys."""
    to = _method_to(fn)

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from ..inputs import tracking
        from . import train_config

        result = to(self, *args, **kwargs)
        tracking.note_model(self)
        param = next(iter(self.parameters()), None)
        if param is not None and param.device.type == real_name(ALIAS):
            train_config.on_tracked(self)
        return result
    return wrapper


def _patch(owner: Any, name: str, make: Any) -> None:
    original = owner.__dict__.get(name, getattr(owner, name, None)) if isinstance(owner, type) else \
        getattr(owner, name, None)
    if original is None:
        return
    _saved.append((owner, name, owner.__dict__.get(name) if isinstance(owner, type) else original))
    setattr(owner, name, make(getattr(owner, name)))


def _build_torch_factory_tables() -> None:
    """torch builds some tables of its factory functions lazily, keyed by the function objects: the one
    ``with torch.device("meta")`` and ``torch.set_default_device`` consult to decide which calls get the device
    (``torch.utils._device._device_constructors``). Built while the wrappers below stand in ``torch``, it would
    hold the wrappers, never the functions they call, and those contexts would stop placing tensors, for good
    (transformers builds models under ``torch.device("meta")``: every buffer would be real memory left unfilled
    after loading). Built here first, from torch's own functions; rebuilt when it lacks them."""
    import torch
    from torch.utils import _device

    tables = getattr(_device, "_device_constructors", None)
    if tables is None:
        return
    if torch.empty not in tables():
        tables.cache_clear()
        tables()


def install() -> None:
    import torch

    if _saved:
        return
    _build_torch_factory_tables()
    for name in FACTORIES:
        _patch(torch, name, _first_arg_is_device if name == "set_default_device" else _device_kwarg)
    for name in TENSOR_METHODS:
        _patch(torch.Tensor, name, _method_to if name == "to" else _device_kwarg)
    _patch(torch.nn.Module, "to", _module_to)
    _patch(torch.nn.Module, "npu", _module_to)


def uninstall() -> None:
    while _saved:
        owner, name, original = _saved.pop()
        if original is None and isinstance(owner, type):
            delattr(owner, name)  # it was inherited (Tensor.to comes from TensorBase)
        else:
            setattr(owner, name, original)


def is_installed() -> bool:
    return bool(_saved)
