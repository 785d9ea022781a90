"""npu-sim's kernels: every aten operator with a CPU kernel gets a Python kernel on PrivateUse1.

npu tensors become CPU aliases of the same memory (zero copy), out= and in-place arguments included, the
CPU kernel runs, fresh outputs are retagged as npu. Each op is one trip through Python, with what its
schema says read once; one boxed fallback catches operators without a kernel of their own. Autograd,
optimizers and ``torch.save`` sit above the dispatch key and work unchanged.
"""
from __future__ import annotations

from typing import Any

import torch

from .device import NAME, NpuSimError, check_device
from .memory import _KDL_CPU, _KDL_EXT_DEV, SPECIAL, from_cpu, retag

_retag = retag
_check_device = check_device
_Tensor = torch.Tensor
_is_zerotensor = torch.Tensor._is_zerotensor
_CPU = torch.device("cpu")

_TENSOR, _TENSORS, _DEVICE, _INDICES = 1, 2, 3, 4  # argument kinds the kernel converts, from the schema
_KINDS = {"Tensor": _TENSOR, "Optional[Tensor]": _TENSOR, "List[Tensor]": _TENSORS,
          "List[Optional[Tensor]]": _TENSORS, "Device": _DEVICE, "Optional[Device]": _DEVICE}
# operators that take tensors of any device, as on CUDA (the rest: npu tensors and 0-dim CPU ones only)
_ANY_DEVICE = {"aten::_foreach_copy_", "aten::_foreach_copy", "aten::is_set_to", "aten::is_same_size"}
# operators whose CUDA kernels take no CPU scalars either (not TensorIterator kernels with scalar support)
_NO_CPU_SCALARS = {"aten::nextafter", "aten::multi_margin_loss", "aten::multilabel_margin_loss_forward"}


class _OpInfo:
    """What the kernel needs to know about one operator overload, read once from its schema."""

    __slots__ = ("call", "checks", "device_at", "mutable_kw", "mutable_pos", "name", "op", "plan", "returns")

    def __init__(self, op: Any) -> None:
        schema = op._schema
        self.name = str(op)
        self.op = op
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
            elif kind == _TENSORS and a.name == "indices" and str(a.type) == "List[Optional[Tensor]]":
                kind = _INDICES  # indexing an npu tensor with CPU index tensors is allowed, as on CUDA
            if kind is not None and not a.kwarg_only:
                plan.append((i, kind))
            info = a.alias_info
            if info is not None and info.is_write:
                (mutable_kw.append(a.name) if a.kwarg_only else mutable_pos.append(i))
                for s in info.before_set:
                    alias_arg[s] = (True, a.name) if a.kwarg_only else (False, i)
        self.plan = tuple(plan)
        # placement is checked unless the op takes any device (copies) or names one (factories, _to_copy,
        # empty_like(..., device="cpu"))
        self.checks = 0 if self.device_at is not None or schema.name in _ANY_DEVICE else (
            2 if schema.name in _NO_CPU_SCALARS else 1)
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


class _Tracing:
    """cann.torch.profiler with ProfilerActivity.CANN: one "npu::op" event per kernel while ``on``."""

    on = False


_tracing = _Tracing()


def set_tracing(on: bool) -> None:
    _tracing.on = bool(on)


def _traced_call(info: _OpInfo, cargs: list[Any], ckw: dict[str, Any]) -> Any:
    """The CPU kernel inside a profiler event named after the npu operator, with its input shapes."""
    from torch._C._profiler import _RecordFunctionFast

    tensors = [a for a in cargs if isinstance(a, _Tensor)]
    with _RecordFunctionFast(f"npu::{info.name.removeprefix('aten.')}", tensors):
        return info.call(*cargs, **ckw)


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


def _misplaced(a: Any, checks: int) -> bool:
    """A tensor an npu kernel cannot take: not on npu and not a 0-dim CPU tensor (CUDA's rule; ``checks`` 2:
    no CPU scalar either)."""
    return a.device.type != NAME and (a.device.type != "cpu" or a.dim() != 0 or checks == 2)


def _checked_to_cpu(a: Any, checks: int) -> Any:
    """``_to_cpu`` for an argument the op's placement rule covers (a list or a keyword such as out=)."""
    if isinstance(a, _Tensor):
        if a.device.type == NAME:
            return _retag(a, _KDL_CPU)
        if _misplaced(a, checks):
            raise _Mismatch
        return a
    if isinstance(a, (list, tuple)) and a and any(isinstance(x, _Tensor) for x in a):
        # as fast as _to_cpu's comprehension: anything not on npu goes through _off_npu (the rare path)
        return [_retag(x, _KDL_CPU) if isinstance(x, _Tensor) and x.device.type == NAME else _off_npu(x, checks)
                for x in a]
    if isinstance(a, torch.device):
        return _device_to_cpu(a)
    return a


def _off_npu(x: Any, checks: int) -> Any:
    """A list element not on npu: kept when it is not a tensor or is allowed there (a 0-dim CPU tensor)."""
    if isinstance(x, _Tensor) and _misplaced(x, checks):
        raise _Mismatch
    return x


class _Mismatch(Exception):
    """Raised inside the conversion loop; ``_run`` turns it into torch's message with the arguments."""


def _mismatch_error(info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RuntimeError:
    """torch's device-mismatch error, naming the first device and the first argument on another one (CPU
    indices count only when the indexed tensor is the one off npu: ``cpu_tensor[npu_indices]``)."""
    names = [a.name for a in info.op._schema.arguments]
    indices = {i for i, kind in info.plan if kind == _INDICES}

    def placed(skip: set[int]) -> list[tuple[str, torch.device]]:
        tensors = [(names[i] if i < len(names) else f"#{i}", x) for i, a in enumerate(args) if i not in skip
                   for x in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(x, _Tensor)]
        tensors += [(k, x) for k, v in kwargs.items() for x in (v if isinstance(v, (list, tuple)) else (v,))
                    if isinstance(x, _Tensor)]
        return [(n, t.device) for n, t in tensors if info.checks == 2 or not (t.device.type == "cpu" and t.dim() == 0)]

    devices = placed(indices)
    if len({d for _, d in devices}) < 2:
        devices = placed(set())
    first = devices[0][1] if devices else torch.device(NAME, 0)
    name, other = next(((n, d) for n, d in devices if d != first), devices[0] if devices else ("?", _CPU))
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {first} "
                        f"and {other}! (when checking argument for argument {name} in method {info.name})")


def _wrap(o: Any) -> Any:
    if isinstance(o, _Tensor):
        if o.device.type != "cpu":
            return o
        if o.layout != torch.strided:
            raise NpuSimError(f"npu-sim emulates dense (strided) tensors only; this operator made a {o.layout} "
                              "tensor. Run sparse / quantized / nested work on the CPU (tensor.cpu()).")
        if _is_zerotensor(o):  # autograd's memory-less zeros (sgn's gradient): DLPack would hand out null
            return _retag(torch.zeros(o.shape, dtype=o.dtype), _KDL_EXT_DEV)
        return _retag(o, _KDL_EXT_DEV)
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
    # a wrapped number takes its floating peers' dtype (a float64 0-dim tensor would win when every peer
    # is 0-dim, where torch keeps float32: margin_ranking_loss on scalars)
    floating = [c.dtype for c in peers if isinstance(c, _Tensor) and c.is_floating_point()]
    return torch.tensor(x, dtype=max(floating, key=lambda d: torch.finfo(d).bits) if floating
                        else torch.get_default_dtype())


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
    checks = info.checks
    try:
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
                    elif checks and (a.dim() != 0 or a.device.type != "cpu" or checks == 2):
                        raise _Mismatch
                else:
                    cargs[i] = _scalar_tensor(a, cargs)
            elif kind == _TENSORS:
                cargs[i] = _checked_to_cpu(a, checks) if checks else _to_cpu(a)
            elif kind == _INDICES:
                cargs[i] = _to_cpu(a)
            else:
                cargs[i] = _device_to_cpu(a)
        ckw = kwargs and ({k: _checked_to_cpu(v, checks) for k, v in kwargs.items()} if checks
                          else {k: _to_cpu(v) for k, v in kwargs.items()})
    except _Mismatch:
        raise _mismatch_error(info, args, kwargs) from None
    try:
        out = _traced_call(info, cargs, ckw) if _tracing.on else info.call(*cargs, **ckw)
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
                 for v, hit in zip(out, returns, strict=False))


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The boxed fallback for operators without a kernel of their own on npu (see ``_kernel_for``)."""
    info = _infos.get(op)
    if info is None:
        special = SPECIAL.get(op._schema.name)
        if special is not None:
            return special(op, *args, **kwargs)
        info = _infos[op] = _OpInfo(op)
    return _run(info, args, kwargs)


def _kernel_for(op: Any) -> Any:
    """A kernel registered for one operator on npu: the same work as the fallback, without its lookup."""
    special = SPECIAL.get(op._schema.name)
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


