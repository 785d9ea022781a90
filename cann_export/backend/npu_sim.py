"""npu-sim: an emulated ``npu`` device on PyTorch's PrivateUse1 extension point, computing on the CPU.

How it works (pure Python, no C++ to compile):

* ``torch.utils.backend_registration._setup_privateuseone_for_python_backend("npu", ...)`` renames
  PrivateUse1 to ``npu``, generates ``Tensor.npu()``/``Module.npu()``, registers our device module as
  ``torch.npu`` and the Python-level PrivateUse1 hooks and device guard.
* An ``npu`` tensor owns real CPU memory: a CPU tensor is handed to ``torch._C._from_dlpack`` through a
  DLPack capsule whose device is retagged ``kDLExtDev`` (which ATen maps to PrivateUse1), so the npu
  tensor's storage keeps the CPU memory alive and every C++ alias (detach, ``.data``, views) shares it.
* One boxed fallback kernel on the PrivateUse1 dispatch key runs every operator: npu tensors become CPU
  aliases of the same memory (the reverse retag, zero copy), the CPU kernel runs, fresh outputs are
  retagged as npu. Autograd, optimizers and ``torch.save`` sit above the dispatch key and work unchanged.
"""
from __future__ import annotations

import ctypes
import importlib.util
import threading
from typing import Any

import torch

NAME = "npu"
_KDL_CPU = 1
_KDL_EXT_DEV = 12  # DLPack's kDLExtDev; ATen maps it to PrivateUse1


class NpuSimError(RuntimeError):
    """A feature npu-sim does not emulate; the message says what to do instead."""


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
_Tensor = torch.Tensor
_CPU = torch.device("cpu")

_lock = threading.Lock()
_installed = False
_library: Any = None
_libraries: list[Any] = []


def _retag(t: torch.Tensor, device_type: int) -> torch.Tensor:
    """The same memory, viewed as a tensor of another device type (CPU <-> PrivateUse1)."""
    capsule = _to_dlpack(t)
    _c_int_at(_capsule_pointer(capsule, b"dltensor") + _DEVICE_OFFSET).value = device_type
    return _from_dlpack(capsule)


def to_cpu_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over an npu tensor's memory (no copy)."""
    return _retag(t, _KDL_CPU)


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """An npu tensor owning ``t``'s memory (no copy); ``t`` stays alive as long as the result."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return _retag(t, _KDL_EXT_DEV)


# --------------------------------------------------------------------------------------- the fallback

def _check_device(d: Any) -> torch.device:
    d = torch.device(d)
    if d.type == NAME and d.index not in (None, 0):
        raise NpuSimError(f"npu-sim emulates a single device, npu:0; {d} does not exist "
                          "(cann.torch.device_count() is 1). Use 'npu' or 'npu:0'.")
    return d


class _OpInfo:
    """What the fallback needs to know about one operator overload, computed once."""

    __slots__ = ("tensor_pos", "device_kw", "device_pos", "write_returns", "mutable_pos", "mutable_kw",
                 "n_returns")

    def __init__(self, op: Any) -> None:
        schema = op._schema
        self.tensor_pos: list[int] = []
        self.device_pos: int | None = None
        self.device_kw = False
        self.mutable_pos: list[int] = []
        self.mutable_kw: list[str] = []
        alias_arg: dict[Any, tuple[str, Any]] = {}
        for i, a in enumerate(schema.arguments):
            ty = str(a.type)
            if ty in ("Tensor", "Tensor?"):
                self.tensor_pos.append(i)
            if ty.startswith("Device"):
                self.device_kw = True
                if not a.kwarg_only:
                    self.device_pos = i
            info = a.alias_info
            if info is not None and info.is_write:
                if a.kwarg_only:
                    self.mutable_kw.append(a.name)
                else:
                    self.mutable_pos.append(i)
                for s in info.before_set:
                    alias_arg[s] = ("kw", a.name) if a.kwarg_only else ("pos", i)
        self.write_returns: list[Any] = []
        for r in schema.returns:
            info = r.alias_info
            hit = None
            if info is not None and info.is_write:
                hit = next((alias_arg[s] for s in info.before_set if s in alias_arg), None)
            self.write_returns.append(hit)
        self.n_returns = len(schema.returns)


_infos: dict[Any, _OpInfo] = {}
_special: dict[str, Any] = {}


def _to_cpu(a: Any) -> Any:
    if isinstance(a, _Tensor):
        return _retag(a, _KDL_CPU) if a.device.type == NAME else a
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], _Tensor):
        return [_retag(x, _KDL_CPU) if x.device.type == NAME else x for x in a]
    if isinstance(a, torch.device):
        return _CPU if _check_device(a).type == NAME else a
    return a


def _wrap(o: Any) -> Any:
    if isinstance(o, _Tensor):
        return _retag(o, _KDL_EXT_DEV) if o.device.type == "cpu" else o
    if isinstance(o, (list, tuple)):
        return type(o)(_wrap(x) for x in o)
    return o


def _scalar_tensor(x: Any, floating_peer: bool) -> torch.Tensor:
    """A number where the schema wants a Tensor (ATen passes wrapped numbers to Python as numbers)."""
    if isinstance(x, bool):
        return torch.tensor(x)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, complex):
        return torch.tensor(x)
    return torch.tensor(x, dtype=torch.float64 if floating_peer else torch.get_default_dtype())


def _rebind(npu_t: torch.Tensor, cpu_t: torch.Tensor) -> None:
    """After an op changed a mutable argument's metadata (resize, out=), point the npu tensor at it."""
    if (cpu_t.data_ptr() != npu_t.data_ptr() or cpu_t.shape != npu_t.shape or cpu_t.stride() != npu_t.stride()):
        npu_t.data = from_cpu(cpu_t)


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    info = _infos.get(op)
    if info is None:
        special = _special.get(op._schema.name)
        if special is not None:
            return special(op, *args, **kwargs)
        info = _infos[op] = _OpInfo(op)
    cargs = [_to_cpu(a) for a in args]
    for i in info.tensor_pos:
        if i < len(cargs) and isinstance(cargs[i], (int, float, bool, complex)):
            cargs[i] = _scalar_tensor(cargs[i], any(isinstance(c, _Tensor) and c.is_floating_point() for c in cargs))
    ckw = {k: _to_cpu(v) for k, v in kwargs.items()} if kwargs else kwargs
    # out= tensors: the CPU kernel may need to resize them, which an alias of npu memory cannot do; it
    # writes a fresh tensor, copied into the npu one (same shape) or rebound to it (new shape)
    for name in info.mutable_kw:
        o = kwargs.get(name)
        if isinstance(o, _Tensor) and o.device.type == NAME:
            ckw[name] = torch.empty(0, dtype=o.dtype)
    out = op(*cargs, **ckw)
    for i in info.mutable_pos:
        a = args[i]
        if isinstance(a, _Tensor) and a.device.type == NAME:
            _rebind(a, cargs[i])
    for name in info.mutable_kw:
        o = kwargs.get(name)
        if isinstance(o, _Tensor) and o.device.type == NAME:
            fresh = ckw[name]
            if fresh.shape == o.shape:
                _retag(o, _KDL_CPU).copy_(fresh)
            else:
                o.data = from_cpu(fresh)
    if info.device_kw:
        dev = kwargs.get("device") if info.device_pos is None or info.device_pos >= len(args) else args[info.device_pos]
        if dev is not None and torch.device(dev).type != NAME:
            return out
    if info.n_returns == 0:
        return out
    if info.n_returns == 1:
        hit = info.write_returns[0]
        if hit is not None:
            return kwargs[hit[1]] if hit[0] == "kw" else args[hit[1]]
        return _wrap(out)
    result = []
    for value, hit in zip(out, info.write_returns):
        if hit is not None:
            result.append(kwargs[hit[1]] if hit[0] == "kw" else args[hit[1]])
        else:
            result.append(_wrap(value))
    return tuple(result)


def _special_op(name: str):
    def deco(fn):
        _special[name] = fn
        return fn
    return deco


@_special_op("aten::_copy_from")
def _copy_from(op: Any, self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _to_cpu(dst).copy_(_to_cpu(self))
    return dst


@_special_op("aten::_copy_from_and_resize")
def _copy_from_and_resize(op: Any, self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != self.shape:
        dst.data = from_cpu(torch.empty(self.shape, dtype=dst.dtype))
    _to_cpu(dst).copy_(_to_cpu(self))
    return dst


@_special_op("aten::set_")
def _set(op: Any, self: torch.Tensor, source: Any = None, storage_offset: int = 0, size: Any = None,
         stride: Any = None) -> torch.Tensor:
    """``set_`` changes the npu tensor's own metadata, so it is done on the npu tensor (``.data``)."""
    overload = op._overloadname
    if overload == "source_Tensor":
        self.data = source if source.device.type == NAME else from_cpu(source)
        return self
    if overload == "" or source is None:
        self.data = from_cpu(torch.empty(0, dtype=self.dtype))
        return self
    if source.device.type != NAME:
        raise NpuSimError(f"set_: cannot point an npu tensor at a {source.device} storage")
    nbytes = source.nbytes()
    cpu_storage = torch._C._construct_storage_from_data_pointer(source.data_ptr(), _CPU, nbytes)
    if size is None:
        size, stride = [nbytes // self.element_size()], [1]
    t = torch.empty(0, dtype=self.dtype).set_(cpu_storage, storage_offset, size, stride)
    t._npu_sim_owner = source  # the npu storage owns the memory; keep it alive as long as the alias
    self.data = from_cpu(t)
    return self


@_special_op("aten::_pin_memory")
@_special_op("aten::is_pinned")
def _pinned(op: Any, *args: Any, **kwargs: Any) -> Any:
    if op._schema.name == "aten::is_pinned":
        return False
    raise NpuSimError("npu-sim has no pinned (page-locked) host memory: pin_memory() is not supported. "
                      "Drop pin_memory=True / .pin_memory() when running on npu-sim.")


@_special_op("aten::resize_")
def _resize(op: Any, self: torch.Tensor, size: list[int], memory_format: Any = None) -> torch.Tensor:
    alias = to_cpu_alias(self)
    needed = 1
    for s in size:
        needed *= s
    if needed * self.element_size() + self.storage_offset() * self.element_size() <= self.untyped_storage().nbytes():
        alias.resize_(size)
        _rebind(self, alias)
    else:  # grow: new memory, old contents copied over (ATen's resize semantics)
        fresh = torch.empty(size, dtype=self.dtype)
        n = min(alias.numel(), fresh.numel())
        fresh.view(-1)[:n].copy_(alias.reshape(-1)[:n])
        self.data = from_cpu(fresh)
    return self


# ----------------------------------------------------------------------------- device module and hooks

class _DeviceModule:
    """``torch.npu`` under npu-sim: one device, synchronous, the CPU's random number generator."""

    is_emulated = True

    class device:  # noqa: N801 - torch's device-module protocol: a context manager selecting a device
        def __init__(self, device: Any) -> None:
            if device is not None:
                _check_device(device if not isinstance(device, int) else torch.device(NAME, device))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: Any) -> None:
        d = device if isinstance(device, int) else _check_device(device).index
        if d not in (None, 0):
            _check_device(torch.device(NAME, d))

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:  # npu-sim draws from the CPU generator, seeded by torch.manual_seed
        return None

    manual_seed_all = manual_seed

    @staticmethod
    def seed() -> None:
        return None

    seed_all = seed

    @staticmethod
    def initial_seed() -> int:
        return torch.initial_seed()

    @staticmethod
    def get_rng_state(device: Any = "npu") -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = "npu") -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def is_bf16_supported() -> bool:
        return True

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "npu-sim (emulated on CPU)"

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0


_DIRECT_OPS = ("convolution", "convolution_backward", "mse_loss")


def _direct_kernel(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _fallback(op, *args, **kwargs)
    return kernel


def _refuse_pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    raise NpuSimError("npu-sim has no pinned (page-locked) host memory: pin_memory() is not supported. "
                      "Drop pin_memory=True / .pin_memory() when running on npu-sim.")


def _deserialize(obj: Any, location: str) -> Any:
    """``torch.load`` onto npu: the CPU bytes become an npu storage (torch's own path would allocate
    through a PrivateUse1 allocator, which only C++ can register)."""
    if not location.startswith(NAME):
        return None
    _check_device(location)
    if obj.device.type == NAME:
        return obj
    host = torch.empty(0, dtype=torch.uint8).set_(obj.cpu())
    return from_cpu(host).untyped_storage()


def _serialization_tag(obj: Any) -> str | None:
    return None  # torch's own privateuse1 tagger names npu storages "npu:0"


def real_torch_npu_importable() -> tuple[bool, str]:
    """Whether Ascend's torch_npu can be imported here (imported only when it is installed)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # a broken CANN install is reported, not raised
        return False, f"torch_npu is installed but failed to import: {type(e).__name__}: {e}"
    return True, "torch_npu imports"


def is_installed() -> bool:
    return _installed


def _refuse_inductor() -> None:
    """torch.compile's default backend (inductor) has no code generator for npu-sim and fails deep inside
    with an internal assert; inductor's pre-grad pass hook runs first, so refuse there with a message.
    Eager backends ("eager", "aot_eager") never run inductor passes and keep working."""
    import torch._inductor.config as inductor_config

    previous = inductor_config.pre_grad_custom_pass

    def refuse_npu_graphs(graph: Any) -> None:
        for node in graph.nodes:
            value = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(value, torch.Tensor) and value.device.type == NAME:
                raise NpuSimError("torch.compile with the inductor backend does not run on npu-sim (it generates "
                                  "code for real devices); use torch.compile(model, backend='eager') or "
                                  "backend='aot_eager', or run without torch.compile")
        if previous is not None:
            previous(graph)

    inductor_config.pre_grad_custom_pass = refuse_npu_graphs


def install() -> None:
    """Make ``npu`` an emulated device in this process (idempotent). Refuses when the PrivateUse1 name
    is already taken (by the real torch_npu or another backend): there is one such slot per process."""
    global _installed, _library
    with _lock:
        if _installed:
            return
        ok, why = real_torch_npu_importable()
        if ok:
            raise NpuSimError("the real torch_npu imports in this environment, so npu-sim steps aside: "
                              "`npu` is the Ascend device. Use backend 'npu' (or cann.torch.enable(), which "
                              "picks it).")
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone":
            raise NpuSimError(f"the PrivateUse1 device is already named {current!r} in this process; npu-sim "
                              "needs it and cannot share it. Run npu-sim in a fresh process.")
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(NAME, backend_module=_DeviceModule())
        lib = torch.library.Library("_", "IMPL")
        lib.fallback(_fallback, "PrivateUse1")
        _library = lib
        # composite kernels that would pick a device-specific path ("*_overrideable") run on the CPU kernel
        direct = torch.library.Library("aten", "IMPL")
        for name in _DIRECT_OPS:
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                direct.impl(op, _direct_kernel(op), "PrivateUse1")
        _libraries.append(direct)
        # host-side pinning is asked of the CPU tensor before any npu kernel runs: refuse it there
        pin = torch.library.Library("aten", "IMPL")
        pin.impl("_pin_memory", _refuse_pin_memory, "CPU")
        _libraries.append(pin)
        torch.serialization.register_package(5, _serialization_tag, _deserialize)
        from .npu_autocast import install as install_autocast

        install_autocast()
        _refuse_inductor()
        _installed = True
