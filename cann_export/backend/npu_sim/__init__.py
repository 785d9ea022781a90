"""npu-sim: an emulated ``npu`` device on PyTorch's PrivateUse1 extension point, computing on the CPU.

Pure Python, no C++ to compile; one module per concern:

* ``device``: the device name, its single device and ``torch.npu`` (with ``amp`` and graph mode);
* ``memory``: npu tensors own CPU memory through DLPack (no PrivateUse1 allocator is ever called), the
  operators that touch storage (``set_``, ``resize_``, copies), ``torch.save``/``load``;
* ``kernels``: one Python kernel per aten operator with a CPU kernel, running it on zero-copy aliases;
* ``autograd_thread``: backward on the calling thread; ``inductor_guard``: a clear refusal of inductor.

``install()`` registers all of it; ``uninstall()`` undoes it except what torch cannot undo: PrivateUse1
stays named ``npu`` with its generated ``Tensor.npu()``/``Module.npu()`` and ``torch.npu`` (torch has no
way to rename it back), so afterwards npu tensors cannot run operators and another PrivateUse1 backend
cannot take the slot in this process.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

import torch

from .device import NAME, DeviceModule, NpuSimError
from .memory import from_cpu, to_cpu_alias

__all__ = ["NAME", "NpuSimError", "from_cpu", "install", "is_installed", "real_torch_npu_importable",
           "to_cpu_alias", "uninstall"]

TESTED_TORCH = ((2, 6), (2, 13))  # first and last minor release npu-sim runs on; others are refused
ANY_TORCH_ENV = "CANN_EXPORT_NPU_SIM_ANY_TORCH"


class _State:
    """What ``install()`` did in this process (one PrivateUse1 slot per process, so one state)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed = False
        self.renamed = False  # PrivateUse1 was named npu by us (never undone)
        self.libraries: list[Any] = []  # the operator registrations uninstall() destroys


_state = _State()


def real_torch_npu_importable() -> tuple[bool, str]:
    """Whether Ascend's torch_npu can be imported here (imported only when it is installed)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken CANN install is reported, not raised
        return False, f"torch_npu is installed but failed to import: {type(e).__name__}: {e}"
    return True, "torch_npu imports"


def is_installed() -> bool:
    return _state.installed


def owns_privateuse1() -> bool:
    """Whether PrivateUse1 is named ``npu`` by npu-sim in this process (installed now or before)."""
    return _state.renamed and torch._C._get_privateuse1_backend_name() == NAME


def torch_version_supported(version: str | None = None) -> tuple[bool, str]:
    """npu-sim leans on torch internals (the Python PrivateUse1 setup, DLPack device tags, dispatch
    details): a torch outside the tested range is refused unless ``CANN_EXPORT_NPU_SIM_ANY_TORCH=1``."""
    version = version or torch.__version__
    try:
        major_minor = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False, f"cannot read torch version {version!r}"
    low, high = TESTED_TORCH
    if low <= major_minor <= high:
        return True, f"torch {version} is in the tested range"
    if os.environ.get(ANY_TORCH_ENV) == "1":
        return True, f"torch {version} is untested ({ANY_TORCH_ENV}=1)"
    return False, (f"npu-sim was tested with torch {low[0]}.{low[1]} to {high[0]}.{high[1]}; this is torch "
                   f"{version}. Install a tested torch, or set {ANY_TORCH_ENV}=1 to try anyway")


def install() -> None:
    """Make ``npu`` an emulated device in this process (idempotent). Refuses when the PrivateUse1 name
    is already taken (by the real torch_npu or another backend): there is one such slot per process."""
    with _state.lock:
        if _state.installed:
            return
        ok, why = real_torch_npu_importable()
        if ok:
            raise NpuSimError("the real torch_npu imports in this environment, so npu-sim steps aside: "
                              "`npu` is the Ascend device. Use backend 'npu' (or cann.torch.enable(), which "
                              "picks it).")
        ok, why = torch_version_supported()
        if not ok:
            raise NpuSimError(why)
        current = torch._C._get_privateuse1_backend_name()
        if not (_state.renamed and current == NAME):
            if current != "privateuseone":
                raise NpuSimError(f"the PrivateUse1 device is already named {current!r} in this process; "
                                  "npu-sim needs it and cannot share it. Run npu-sim in a fresh process.")
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

            _setup_privateuseone_for_python_backend(NAME, backend_module=DeviceModule())
            _state.renamed = True
        from .. import npu_autocast
        from . import autograd_thread, inductor_guard, kernels, memory

        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(kernels._fallback, "PrivateUse1")
        direct = torch.library.Library("aten", "IMPL")
        for op in kernels._direct_ops():
            direct.impl(op, kernels._kernel_for(op), "PrivateUse1")
        for name in ("_conj", "_neg_view"):
            op = getattr(torch.ops.aten, name).default
            direct.impl(name, lambda self, _op=op: memory.materialized_view(_op, self), "PrivateUse1")
        direct.impl("_has_compatible_shallow_copy_type", kernels._compatible_shallow_copy, "PrivateUse1")
        # host-side pinning is asked of the CPU tensor before any npu kernel runs: refuse it there
        pin = torch.library.Library("aten", "IMPL")
        pin.impl("_pin_memory", memory.refuse_pin_memory, "CPU")
        _state.libraries.extend([fallback, direct, pin])
        memory.install_storage_constructor()
        torch.serialization.register_package(5, memory.serialization_tag, memory.deserialize)
        npu_autocast.install()
        inductor_guard.install()
        autograd_thread.install()
        _state.installed = True


def uninstall() -> None:
    """Undo ``install()`` as far as torch allows (see the module docstring for what stays)."""
    with _state.lock:
        if not _state.installed:
            return
        from .. import npu_autocast
        from . import autograd_thread, inductor_guard, kernels, memory

        for lib in _state.libraries:
            lib._destroy()
        _state.libraries.clear()
        kernels._infos.clear()
        npu_autocast.uninstall()
        memory.uninstall_storage_constructor()
        registry = torch.serialization._package_registry
        registry[:] = [entry for entry in registry if entry[1] is not memory.serialization_tag]
        inductor_guard.uninstall()
        autograd_thread.uninstall()
        from .. import graph_mode

        graph_mode.enable_graph_mode(False)
        _state.installed = False
