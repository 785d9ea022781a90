"""The ``npu`` device itself under npu-sim: its name, the one device it has, and ``torch.npu``."""
from __future__ import annotations

from typing import Any

import torch

NAME = "npu"


class NpuSimError(RuntimeError):
    """A feature npu-sim does not emulate; the message says what to do instead."""


def _check_device(d: Any) -> torch.device:
    d = torch.device(d)
    if d.type == NAME and d.index not in (None, 0):
        raise NpuSimError(f"npu-sim emulates a single device, npu:0; {d} does not exist "
                          "(cann.torch.device_count() is 1). Use 'npu' or 'npu:0'.")
    return d


check_device = _check_device


class _Amp:
    """``torch.npu.amp``, as in torch_npu: ``autocast()`` is ``torch.autocast("npu")`` and ``GradScaler()``
    is ``torch.amp.GradScaler("npu")``."""

    @staticmethod
    def autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> Any:
        return torch.autocast(NAME, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    @staticmethod
    def GradScaler(*args: Any, **kwargs: Any) -> Any:  # torch_npu's spelling
        return torch.amp.GradScaler(NAME, *args, **kwargs)


class DeviceModule:
    """``torch.npu`` under npu-sim: one device, synchronous, the CPU's random number generator."""

    is_emulated = True
    amp = _Amp()

    @staticmethod
    def enable_graph_mode(flag: bool = True) -> str:
        """torch_npu 1.x's graph mode: modules called afterwards run through ``torch.compile`` (backend
        ``aot_eager`` on npu-sim). Returns what was done."""
        from ..graph_mode import enable_graph_mode

        return enable_graph_mode(flag)

    @staticmethod
    def disable_graph_mode() -> str:
        from ..graph_mode import enable_graph_mode

        return enable_graph_mode(False)

    class device:  # torch's device-module protocol: a context manager selecting a device
        def __init__(self, device: Any) -> None:
            if device is not None:
                _check_device(device if not isinstance(device, int) else torch.device(NAME, device))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
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


