"""npu-sim: an emulated ``npu`` device on PyTorch's PrivateUse1 extension point, computing on the CPU.

How it works (pure Python, no C++ to compile):

* ``torch.utils.backend_registration._setup_privateuseone_for_python_backend("npu", ...)`` renames
  PrivateUse1 to ``npu``, generates ``Tensor.npu()``/``Module.npu()``, registers our device module as
  ``torch.npu`` and the Python-level PrivateUse1 hooks and device guard.
* An ``npu`` tensor owns real CPU memory: a CPU tensor is handed to ``torch._C._from_dlpack`` through a
  DLPack capsule whose device is retagged ``kDLExtDev`` (which ATen maps to PrivateUse1), so the npu
  tensor's storage keeps the CPU memory alive and every C++ alias (detach, ``.data``, views) shares it.
* Every aten operator with a CPU kernel gets a Python kernel on the PrivateUse1 dispatch key (one boxed
  fallback catches the rest): npu tensors become CPU aliases of the same memory (the reverse retag, zero
  copy), out= and in-place arguments included, the CPU kernel runs, fresh outputs are retagged as npu.
  Each op is one trip through Python, with what its schema says read once. Autograd, optimizers and
  ``torch.save`` sit above the dispatch key and work unchanged.
* Backward runs on the thread that enabled npu-sim (``torch.autograd.set_multithreading_enabled(False)``
  there), not on autograd's per-device worker thread, which would start a second OpenMP team.
"""
from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import sys
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
    """The same memory, viewed as a tensor of another device type (CPU <-> PrivateUse1).

    The capsule is taken of a detached alias: DLPack keeps the *tensor* it was given alive, and a tensor's
    storage can be swapped later (``p.data = ...``, resize, out=); the alias pins the storage itself, so
    views made earlier keep their memory, as they do on CPU."""
    capsule = _to_dlpack(t.detach())
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


_TENSOR, _TENSORS, _DEVICE = 1, 2, 3  # argument kinds the kernel converts, from the schema's types
_KINDS = {"Tensor": _TENSOR, "Optional[Tensor]": _TENSOR, "List[Tensor]": _TENSORS,
          "List[Optional[Tensor]]": _TENSORS, "Device": _DEVICE, "Optional[Device]": _DEVICE}


class _OpInfo:
    """What the kernel needs to know about one operator overload, read once from its schema."""

    __slots__ = ("call", "device_at", "mutable_kw", "mutable_pos", "name", "plan", "returns")

    def __init__(self, op: Any) -> None:
        schema = op._schema
        self.name = str(op)
        self.call = op._op  # the C++ callable behind the OpOverload (skips its Python __call__)
        plan: list[tuple[int, int]] = []  # (position, kind) of positional arguments to convert
        self.device_at: int | str | None = None  # where a device argument is passed, if the op has one
        mutable_pos: list[int] = []
        mutable_kw: list[str] = []
        alias_arg: dict[Any, tuple[bool, Any]] = {}
        for i, a in enumerate(schema.arguments):
            kind = _KINDS.get(str(a.type))
            if kind == _DEVICE:
                self.device_at = a.name if a.kwarg_only else i
            if kind is not None and not a.kwarg_only:
                plan.append((i, kind))
            info = a.alias_info
            if info is not None and info.is_write:
                (mutable_kw.append(a.name) if a.kwarg_only else mutable_pos.append(i))
                for s in info.before_set:
                    alias_arg[s] = (True, a.name) if a.kwarg_only else (False, i)
        self.plan = tuple(plan)
        self.mutable_pos = tuple(mutable_pos)
        self.mutable_kw = tuple(mutable_kw)
        returns = []  # per return: None (a new tensor) or where the mutable argument it returns is
        for r in schema.returns:
            info = r.alias_info
            hit = None
            if info is not None and info.is_write:
                hit = next((alias_arg[s] for s in info.before_set if s in alias_arg), None)
            returns.append(hit)
        self.returns = tuple(returns)


_infos: dict[Any, _OpInfo] = {}
_special: dict[str, Any] = {}


def _device_to_cpu(d: torch.device) -> torch.device:
    if d.type != NAME:
        return d
    if d.index not in (None, 0):
        _check_device(d)
    return _CPU


def _to_cpu(a: Any) -> Any:
    if isinstance(a, _Tensor):
        return _retag(a, _KDL_CPU) if a.device.type == NAME else a
    if isinstance(a, (list, tuple)) and a and any(isinstance(x, _Tensor) for x in a):
        return [_retag(x, _KDL_CPU) if isinstance(x, _Tensor) and x.device.type == NAME else x for x in a]
    if isinstance(a, torch.device):
        return _device_to_cpu(a)
    return a


def _wrap(o: Any) -> Any:
    if isinstance(o, _Tensor):
        return _retag(o, _KDL_EXT_DEV) if o.device.type == "cpu" else o
    if isinstance(o, (list, tuple)):
        return type(o)(_wrap(x) for x in o)
    return o


def _scalar_tensor(x: Any, peers: list[Any]) -> torch.Tensor:
    """A number where the schema wants a Tensor (ATen passes wrapped numbers to Python as numbers)."""
    if isinstance(x, bool):
        return torch.tensor(x)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, complex):
        return torch.tensor(x)
    floating_peer = any(isinstance(c, _Tensor) and c.is_floating_point() for c in peers)
    return torch.tensor(x, dtype=torch.float64 if floating_peer else torch.get_default_dtype())


def _rebind(npu_t: Any, cpu_t: Any) -> None:
    """After an op changed a mutable argument's metadata (resize, out=), point the npu tensor at it."""
    if not isinstance(npu_t, _Tensor) or npu_t is cpu_t:
        return  # lists are updated in place (foreach, fused optimizers) and keep their metadata
    if (cpu_t.shape != npu_t.shape or cpu_t.stride() != npu_t.stride()
            or cpu_t.storage_offset() != npu_t.storage_offset()):
        npu_t.data = from_cpu(cpu_t)


def _call_with_fresh_outs(info: _OpInfo, cargs: list[Any], ckw: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """The kernel must grow an out= tensor, which memory borrowed from npu cannot do: it writes fresh CPU
    tensors instead, which the npu out= tensors are then pointed at (ATen's resize semantics)."""
    fresh = {}
    for name in info.mutable_kw:
        o = kwargs.get(name)
        if isinstance(o, _Tensor) and o.device.type == NAME:
            fresh[name] = ckw[name] = torch.empty(0, dtype=o.dtype)
    out = info.call(*cargs, **ckw)
    for name, t in fresh.items():
        kwargs[name].data = from_cpu(t)
    return out


def _run(info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One aten operator on npu tensors: the CPU kernel runs on CPU aliases of the same memory, out= and
    in-place arguments included, and new CPU results are retagged as npu (no copies)."""
    n = len(args)
    cargs = list(args)
    for i, kind in info.plan:
        if i >= n:
            break
        a = cargs[i]
        if a is None:
            continue
        if kind == _TENSOR:
            if isinstance(a, _Tensor):
                if a.device.type == NAME:
                    cargs[i] = _retag(a, _KDL_CPU)
            else:
                cargs[i] = _scalar_tensor(a, cargs)
        elif kind == _TENSORS:
            cargs[i] = _to_cpu(a)
        else:
            cargs[i] = _device_to_cpu(a)
    ckw = {k: _to_cpu(v) for k, v in kwargs.items()} if kwargs else kwargs
    try:
        out = info.call(*cargs, **ckw)
    except RuntimeError as e:
        if not (info.mutable_kw and "not resizable" in str(e)):
            raise
        out = _call_with_fresh_outs(info, cargs, ckw, kwargs)
    for i in info.mutable_pos:
        if i < n:
            _rebind(args[i], cargs[i])
    for name in info.mutable_kw:
        if name in kwargs:
            _rebind(kwargs[name], ckw[name])
    at = info.device_at
    if at is not None:
        dev = kwargs.get(at) if isinstance(at, str) else args[at] if at < n else None
        if dev is not None and dev.type != NAME:
            return out  # e.g. empty_like(npu_tensor, device="cpu"): the result stays where it was asked
    returns = info.returns
    if len(returns) == 1:
        hit = returns[0]
        if hit is None:
            return _wrap(out)
        return kwargs[hit[1]] if hit[0] else args[hit[1]]
    if not returns:
        return out
    return tuple(_wrap(v) if hit is None else kwargs[hit[1]] if hit[0] else args[hit[1]]
                 for v, hit in zip(out, returns))


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The boxed fallback for operators without a kernel of their own on npu (see ``_kernel_for``)."""
    info = _infos.get(op)
    if info is None:
        special = _special.get(op._schema.name)
        if special is not None:
            return special(op, *args, **kwargs)
        info = _infos[op] = _OpInfo(op)
    return _run(info, args, kwargs)


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


def _kernel_for(op: Any) -> Any:
    """A kernel registered for one operator on npu: the same work as the fallback, without its lookup."""
    special = _special.get(op._schema.name)
    if special is not None:
        return lambda *args, **kwargs: special(op, *args, **kwargs)
    info = _infos[op] = _OpInfo(op)
    return lambda *args, **kwargs: _run(info, args, kwargs)


# composite kernels that would pick a device-specific path ("*_overrideable") and list ops (optimizer
# steps, which would otherwise cross into Python once per tensor) run as one call of the CPU kernel
_DIRECT_OPS = ("aten::convolution", "aten::convolution_backward")
_DIRECT_PREFIXES = ("aten::_foreach_", "aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")


def _direct_ops() -> list[Any]:
    """Operators that get their own npu kernel: every aten operator with a CPU kernel (so composite
    kernels do not split one op into an allocation and an out= call, each a trip through Python), and the
    ones above."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    ops = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified.partition(".")
        if has_kernel(qualified, "CPU") or name in _DIRECT_OPS or name.startswith(_DIRECT_PREFIXES):
            ops.append(getattr(getattr(torch.ops.aten, name[6:]), overload or "default"))
    return ops


def _compatible_shallow_copy(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Dense CPU and npu tensors may take each other's data (``param.data = t``), as CPU and CUDA ones may:
    ``Module.to("npu")`` then keeps each Parameter object, so tied weights (GPT-2's embedding and LM head)
    stay tied. torch's default answer for PrivateUse1 is no (pytorch/pytorch#116255)."""
    if all(t.layout == torch.strided and t.device.type in ("cpu", NAME) for t in (self, other)):
        return True
    return torch.ops.aten._has_compatible_shallow_copy_type.default.decompose(self, other)


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


def _refuse_inductor(inductor_config: Any) -> None:
    """torch.compile's default backend (inductor) has no code generator for npu-sim and fails deep inside
    with an internal assert; inductor's pre-grad pass hook runs first, so refuse there with a message.
    Eager backends ("eager", "aot_eager") never run inductor passes and keep working."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    previous = inductor_config.pre_grad_custom_pass

    class RefuseNpuGraphs(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            for node in graph.nodes:
                value = node.meta.get("example_value", node.meta.get("val"))
                if isinstance(value, torch.Tensor) and value.device.type == NAME:
                    raise NpuSimError("torch.compile with the inductor backend does not run on npu-sim (it "
                                      "generates code for real devices); use torch.compile(model, "
                                      "backend='eager') or backend='aot_eager', or run without torch.compile")
            if previous is not None:
                previous(graph)

        def uuid(self) -> Any:  # inductor caches compiled graphs by their passes; ours never changes one
            inner = previous.uuid() if isinstance(previous, CustomGraphPass) else None
            return None if previous is not None and inner is None else f"cann-export-npu-sim-refusal:{inner}"

    inductor_config.pre_grad_custom_pass = RefuseNpuGraphs()


def _when_imported(name: str, callback: Any) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import
    (importing inductor here would add over a second to ``enable()`` for scripts that never compile)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_call(module: Any) -> None:
                    exec_module(module)
                    callback(module)

                spec.loader.exec_module = exec_then_call
            return spec

    sys.meta_path.insert(0, Finder())


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
        direct = torch.library.Library("aten", "IMPL")
        for op in _direct_ops():
            direct.impl(op, _kernel_for(op), "PrivateUse1")
        direct.impl("_has_compatible_shallow_copy_type", _compatible_shallow_copy, "PrivateUse1")
        _libraries.append(direct)
        # host-side pinning is asked of the CPU tensor before any npu kernel runs: refuse it there
        pin = torch.library.Library("aten", "IMPL")
        pin.impl("_pin_memory", _refuse_pin_memory, "CPU")
        _libraries.append(pin)
        torch.serialization.register_package(5, _serialization_tag, _deserialize)
        from .npu_autocast import install as install_autocast

        install_autocast()
        _when_imported("torch._inductor.config", _refuse_inductor)
        # autograd runs a non-CPU device's backward on a worker thread of its own; for npu-sim that thread
        # is a second OpenMP team beside this thread's, and with both teams oversubscribing the cores
        # OpenMP throttles its spinning, so every parallel kernel pays a thread wake-up (measured: MLP step
        # 1.7x CPU -> 1.2x). Backward calls from this thread run on it instead (a public, thread-local switch).
        torch.autograd.set_multithreading_enabled(False)
        _installed = True
