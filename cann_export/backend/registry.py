"""The devices a model can run on: cpu, cuda, the real Ascend npu (torch_npu) and npu-sim.

Each backend is an object with ``name``, ``device`` (torch device string), ``available() -> (bool, reason)``
and ``activate()``; built-ins are registered by ``cann_export.plugins.backends`` through
``register_backends`` exactly like third-party ones. Each declares a ``priority`` and whether the
pipeline's ``auto`` may pick it; ``resolve("auto")`` picks the highest-priority available backend of the
``npu`` device (the real NPU before npu-sim), ``auto_device()`` the one the pipeline runs on.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Backend:
    name: str
    device: str
    description: str
    probe: Callable[[], tuple[bool, str]] = field(repr=False)
    setup: Callable[[], None] = field(repr=False, default=lambda: None)
    priority: int = 0  # higher wins among the available candidates for "auto"
    auto: bool = False  # the pipeline's --backend auto may pick it (an emulator is chosen by name only)

    def available(self) -> tuple[bool, str]:
        return self.probe()

    def activate(self) -> str:
        """Make the device usable in this process; returns the torch device string."""
        ok, why = self.probe()
        if not ok:
            from ..errors import OptionsError

            raise OptionsError(f"backend {self.name!r} is not available: {why}")
        self.setup()
        return self.device


def _cpu() -> tuple[bool, str]:
    return True, "always available"


def _cuda() -> tuple[bool, str]:
    import torch

    if not torch.backends.cuda.is_built():
        return False, f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return False, "no CUDA device visible"
    return True, f"{torch.cuda.device_count()} CUDA device(s)"


def _npu() -> tuple[bool, str]:
    from .npu_sim import is_installed, real_torch_npu_importable

    if is_installed():
        return False, "npu-sim owns the npu device in this process"
    ok, why = real_torch_npu_importable()
    if not ok:
        return False, why
    import torch

    count = torch.npu.device_count() if hasattr(torch, "npu") else 0
    if count < 1:
        return False, "torch_npu imports but reports no NPU device"
    return True, f"torch_npu with {count} device(s)"


def _npu_sim() -> tuple[bool, str]:
    import torch

    from .npu_sim import is_installed, real_torch_npu_importable

    if is_installed():
        return True, "installed in this process"
    ok, _ = real_torch_npu_importable()
    if ok:
        return False, "the real torch_npu imports here; npu-sim steps aside (use 'npu')"
    from .npu_sim import owns_privateuse1

    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone" and not owns_privateuse1():
        return False, f"the PrivateUse1 device is already named {name!r} in this process"
    return True, "emulated npu on the CPU (PrivateUse1)"


def _install_sim() -> None:
    from .npu_sim import install

    install()


def builtin_backends() -> list[Backend]:
    return [
        Backend("cpu", "cpu", "the host CPU", _cpu, priority=0, auto=True),
        Backend("cuda", "cuda", "an NVIDIA GPU through torch.cuda", _cuda, priority=50),
        Backend("npu", "npu", "an Ascend NPU through torch_npu", _npu, lambda: None, priority=100, auto=True),
        Backend("npu-sim", "npu", "an emulated npu device computing on the CPU", _npu_sim, _install_sim,
                priority=10),
    ]


def backends() -> dict[str, Any]:
    from ..hooks.manager import registry

    return registry().backends()


def resolve(name: str = "auto") -> Any:
    """The backend object for ``name``; ``auto`` (or an npu device name) is the available backend of the
    ``npu`` device with the highest priority: the real NPU when torch_npu has one, else npu-sim."""
    from ..errors import OptionsError

    table = backends()
    if name in ("auto", "npu:0", "cann", "cann:0"):
        return _best([b for b in table.values() if b.device == "npu"], "the npu device")
    if name not in table:
        raise OptionsError(f"unknown backend {name!r}; known backends: {', '.join(sorted(table))}")
    return table[name]


def auto_backend() -> Any:
    """The pipeline's ``--backend auto``: the available backend with the highest priority among those
    that declare ``auto`` (the real NPU, else the CPU)."""
    return _best([b for b in backends().values() if b.auto], "--backend auto")


def _best(candidates: list[Any], what: str) -> Any:
    from ..errors import OptionsError

    for backend in sorted(candidates, key=lambda b: -b.priority):
        if backend.available()[0]:
            return backend
    raise OptionsError(f"no backend is available for {what}; `cann-export backends` says why")


def describe() -> list[dict[str, Any]]:
    """One row per backend: name, device, availability and why."""
    rows = []
    for name, b in sorted(backends().items()):
        ok, why = b.available()
        rows.append({"name": name, "device": b.device, "available": ok, "reason": why,
                     "description": b.description})
    return rows
