"""npu-sim's memory: an npu tensor owns real CPU memory, reached through DLPack with the device retagged.

* ``from_cpu(t)``: a CPU tensor handed to ``torch._C._from_dlpack`` through a capsule whose device is
  retagged ``kDLExtDev`` (which ATen maps to PrivateUse1). The npu storage's deleter owns the capsule,
  which owns ``t``: the memory lives exactly as long as the npu storage.
* ``to_cpu_alias(t)``: the reverse retag; the CPU alias owns a detached reference to the npu tensor.
* Nothing allocates through a PrivateUse1 allocator (only C++ can register one; torch would dereference a
  null one): ``UntypedStorage(n, device="npu")`` (storage ``clone``, ``copy.deepcopy``, ``TypedStorage``) is
  served by ``from_cpu``; ``set_`` and in-capacity ``resize_`` change the npu tensor's own metadata
  through the CPU kernels (redispatch), so views keep the storage they were made from.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from .device import NAME, NpuSimError, check_device

_KDL_CPU = 1
_KDL_EXT_DEV = 12  # DLPack's kDLExtDev; ATen maps it to PrivateUse1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLTensorHead(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DEVICE_OFFSET = _DLTensorHead.device.offset
_c_int_at = ctypes.c_int.from_address
_to_dlpack = torch._C._to_dlpack
_from_dlpack = torch._C._from_dlpack
_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def retag(t: torch.Tensor, device_type: int) -> torch.Tensor:
    """The same memory, viewed as a tensor of another device type (CPU <-> PrivateUse1).

    The capsule is taken of a detached alias: DLPack keeps the *tensor* it was given alive, and a tensor's
    storage can be swapped later (``p.data = ...``, resize, out=); the alias pins the storage itself, so
    views made earlier keep their memory, as they do on CPU."""
    capsule = _to_dlpack(t.detach())
    _c_int_at(_capsule_pointer(capsule, b"dltensor") + _DEVICE_OFFSET).value = device_type
    return _from_dlpack(capsule)


def to_cpu_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over an npu tensor's memory (no copy)."""
    return retag(t, _KDL_CPU)


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """An npu tensor owning ``t``'s memory (no copy); ``t`` stays alive as long as the result."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return retag(t, _KDL_EXT_DEV)


def new_storage(nbytes: int) -> torch.UntypedStorage:
    """A fresh npu storage of ``nbytes`` bytes, owning its CPU memory."""
    return from_cpu(torch.empty(nbytes, dtype=torch.uint8)).untyped_storage()


# ------------------------------------------------------------------------ storages made from Python

_storage_new_saved: list[Any] = []  # [had its own __new__, the previous one]


def _storage_new(cls: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
    """``torch.UntypedStorage(...)`` with ``device="npu"``: memory from ``from_cpu``, not from the
    (absent) PrivateUse1 allocator, which torch would call through a null pointer."""
    if device is not None and torch.device(device).type == NAME and not kwargs:
        check_device(device)
        if not args:
            return new_storage(0)
        if len(args) == 1 and isinstance(args[0], int):
            return new_storage(args[0])
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            return from_cpu(torch.tensor(args[0], dtype=torch.uint8)).untyped_storage()
    previous = _storage_new_saved[1]
    if device is not None:
        kwargs["device"] = device
    return previous(cls, *args, **kwargs)


def install_storage_constructor() -> None:
    cls = torch.UntypedStorage
    if _storage_new_saved:
        return
    _storage_new_saved[:] = ["__new__" in cls.__dict__, cls.__new__]
    cls.__new__ = _storage_new


def uninstall_storage_constructor() -> None:
    if not _storage_new_saved:
        return
    own, previous = _storage_new_saved
    if own:
        torch.UntypedStorage.__new__ = previous
    else:
        del torch.UntypedStorage.__new__
    _storage_new_saved.clear()


# ------------------------------------------------------- operators that touch an npu tensor's storage

SPECIAL: dict[str, Any] = {}


def _special_op(name: str):
    def deco(fn):
        SPECIAL[name] = fn
        return fn
    return deco


def _cpu_of(a: Any) -> Any:
    return retag(a, _KDL_CPU) if isinstance(a, torch.Tensor) and a.device.type == NAME else a


@_special_op("aten::_copy_from")
def _copy_from(op: Any, self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _cpu_of(dst).copy_(_cpu_of(self))
    return dst


@_special_op("aten::_copy_from_and_resize")
def _copy_from_and_resize(op: Any, self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != self.shape:
        dst.data = from_cpu(torch.empty(self.shape, dtype=dst.dtype))
    _cpu_of(dst).copy_(_cpu_of(self))
    return dst


@_special_op("aten::set_")
def _set(op: Any, self: torch.Tensor, source: Any = None, *rest: Any, **kwargs: Any) -> torch.Tensor:
    """``set_`` changes the npu tensor's own metadata: the CPU kernel does that on the npu tensor itself
    (it only checks devices match and sets storage, offset, sizes and strides), so the npu storage's
    refcount keeps the memory alive."""
    if op._overloadname == "" or source is None:
        self.data = from_cpu(torch.empty(0, dtype=self.dtype))
        return self
    if source.device.type != NAME:
        if op._overloadname == "source_Tensor":
            self.data = from_cpu(source)
            return self
        raise NpuSimError(f"set_: cannot point an npu tensor at a {source.device} storage; move it first "
                          "(storage.to('npu') or tensor.to('npu'))")
    return op.redispatch(_CPU_KEYS, self, source, *rest, **kwargs)


@_special_op("aten::resize_")
def _resize(op: Any, self: torch.Tensor, size: list[int], memory_format: Any = None) -> torch.Tensor:
    """Within the storage's capacity the CPU kernel only changes metadata (on the npu tensor itself);
    growing needs new memory: the old contents are copied over (ATen's resize semantics).

    Capacity is checked here, not by catching the CPU kernel's "not resizable" error: that kernel sets
    the new sizes *before* it checks the storage, so after the error the tensor claims more memory than
    it has, and reading it runs past the allocation (a segfault when that crosses a page)."""
    numel = 1
    for n in size:
        numel *= int(n)
    needed = (self.storage_offset() + numel) * self.element_size()
    if needed <= self.untyped_storage().nbytes():
        return op.redispatch(_CPU_KEYS, self, size, memory_format=memory_format)
    # ATen grows the storage keeping its bytes, then lays the new shape over it from the same offset
    old = self.untyped_storage()
    grown = torch.zeros(needed, dtype=torch.uint8)
    grown[:old.nbytes()].copy_(to_cpu_alias(torch.empty(0, dtype=torch.uint8, device=self.device).set_(old)))
    strides = torch.empty(size, device="meta", memory_format=memory_format or torch.contiguous_format).stride()
    with torch.no_grad():
        self.set_(from_cpu(grown).untyped_storage(), self.storage_offset(), size, strides)
    return self


def materialized_view(op: Any, self: torch.Tensor) -> torch.Tensor:
    """``_conj`` / ``_neg_view`` on npu: materialized, never a conj/neg-bit view. torch's fallback for
    those bits clones through ``empty_strided`` + ``copy_`` on the same device, which for a
    PrivateUse1 tensor re-enters the fallback without end (a C++ stack overflow, exit 139)."""
    return from_cpu(op(to_cpu_alias(self)))


def _refuse_pinning() -> NpuSimError:
    return NpuSimError("npu-sim has no pinned (page-locked) host memory: pin_memory() is not supported. "
                       "Drop pin_memory=True / .pin_memory() when running on npu-sim.")


@_special_op("aten::_pin_memory")
@_special_op("aten::is_pinned")
def _pinned(op: Any, *args: Any, **kwargs: Any) -> Any:
    if op._schema.name == "aten::is_pinned":
        return False
    raise _refuse_pinning()


def refuse_pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    raise _refuse_pinning()


# ------------------------------------------------------------------------------------ torch.save/load

def deserialize(obj: Any, location: str) -> Any:
    """``torch.load`` onto npu: the CPU bytes become an npu storage (torch's own path would allocate
    through a PrivateUse1 allocator, which only C++ can register)."""
    if not location.startswith(NAME):
        return None
    check_device(location)
    if obj.device.type == NAME:
        return obj
    host = torch.empty(0, dtype=torch.uint8).set_(obj.cpu())
    return from_cpu(host).untyped_storage()


def serialization_tag(obj: Any) -> str | None:
    return None  # torch's own privateuse1 tagger names npu storages "npu:0"
