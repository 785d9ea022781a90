"""Build a ``--model-class`` module without its random weights: parameters are created on the meta device
(no memory, no random init), buffers as the factory computes them, then the file's tensors are assigned in.
Peak memory stays near one copy of the weights instead of two."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While active, every plain ``nn.Parameter`` a module registers moves to the meta device. Buffers stay
    real: non-persistent ones (position ids, rotary frequencies) are not in a state_dict and must keep the
    values the factory computed."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: Any) -> None:
        original(module, name, param)
        p = module._parameters.get(name)
        if type(p) is torch.nn.Parameter and p.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def build_skeleton(factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any | None:
    """``factory(**kwargs)`` with its parameters on the meta device, or None when the factory does not build
    that way (it computes with its weights, or returns something else): the caller then builds it normally."""
    import torch

    try:
        with parameters_on_meta():
            model = factory(**kwargs)
    except Exception:  # noqa: BLE001 - any failure on meta means: build the ordinary way, which reports errors
        return None
    if not isinstance(model, torch.nn.Module):
        return None
    return model


def meta_tensors(model: Any) -> list[str]:
    """Names of the parameters, buffers and plain tensor attributes (a tensor, or a list/tuple of them, that
    ``__init__`` derived from a weight) still on the meta device."""
    import torch

    found = [n for n, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers())
             if t.device.type == "meta"]
    for prefix, module in model.named_modules(remove_duplicate=False):
        for attr, value in vars(module).items():
            items = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in items):
                found.append(f"{prefix}.{attr}" if prefix else attr)
    return found


def assign_state(model: Any, state: dict[str, Any]) -> None:
    """``load_state_dict(strict=True, assign=True)`` with each tensor cast to the dtype the module declares
    (as a copying load would) and tied parameters (one Parameter under several names, e.g. input and output
    embeddings) tied again, to the tensor a copying load would leave in them (the last name's); shape
    mismatches raise load_state_dict's own RuntimeError."""
    own = model.state_dict(keep_vars=True)
    cast = {k: (v.to(own[k].dtype) if k in own and v.dtype != own[k].dtype else v) for k, v in state.items()}
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    model.load_state_dict(cast, strict=True, assign=True)
    for names in groups.values():
        if len(names) > 1:
            last = model.get_parameter(names[-1])
            for name in names[:-1]:
                owner, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(owner), leaf, last)
