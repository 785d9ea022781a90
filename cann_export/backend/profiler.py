"""``cann.torch.profiler``: torch.profiler with a ``CANN`` activity, as in the articles.

* On a real Ascend device (torch_npu imports and npu-sim is not installed) it is torch_npu's profiler,
  ``ProfilerActivity.CANN`` mapped to torch_npu's ``NPU`` activity.
* Elsewhere it is ``torch.profiler.profile``; with ``ProfilerActivity.CANN`` and npu-sim installed, every
  npu operator appears as a ``npu::<op>`` event (category ``cpu_op``) carrying its input shapes when
  ``record_shapes=True``, nested in the aten event the dispatcher records.

``profile(...)``, ``schedule(...)``, ``record_function(...)``, ``tensorboard_trace_handler(...)`` and the
profile object's ``export_chrome_trace(path)``, ``key_averages()``, ``step()`` are torch's own.
"""
from __future__ import annotations

from typing import Any


class ProfilerActivity:
    """Activity names accepted by ``profile(activities=[...])``; torch's own members are accepted too."""

    CPU = "CPU"
    CANN = "CANN"
    NPU = "CANN"


def _real_npu() -> bool:
    from .npu_sim import is_installed, real_torch_npu_importable

    return not is_installed() and real_torch_npu_importable()[0]


def _is_cann(activity: Any) -> bool:
    return activity == ProfilerActivity.CANN or str(activity).upper().endswith(("CANN", "NPU", "PRIVATEUSE1"))


def profile(*, activities: Any = None, **kwargs: Any) -> Any:
    """A profiler context manager; ``activities`` defaults to CPU and CANN."""
    activities = list(activities) if activities is not None else [ProfilerActivity.CPU, ProfilerActivity.CANN]
    cann = any(_is_cann(a) for a in activities)
    if _real_npu():
        import torch_npu

        npu_activity = torch_npu.profiler.ProfilerActivity
        chosen = [npu_activity.NPU if _is_cann(a) else npu_activity.CPU for a in activities]
        return torch_npu.profiler.profile(activities=chosen, **kwargs)
    import torch

    from .npu_sim import is_installed

    class _Profile(torch.profiler.profile):
        """torch.profiler.profile that switches npu-sim's per-kernel events on while it records."""

        def start(self) -> None:
            if cann and is_installed():
                from .npu_sim import kernels

                kernels.set_tracing(True)
            super().start()

        def stop(self) -> None:
            try:
                super().stop()
            finally:
                if cann and is_installed():
                    from .npu_sim import kernels

                    kernels.set_tracing(False)

    # npu-sim computes on the CPU: its operators are CPU activity (torch has no Python PrivateUse1 tracer)
    return _Profile(activities=[torch.profiler.ProfilerActivity.CPU], **kwargs)


def schedule(**kwargs: Any) -> Any:
    import torch

    if _real_npu():
        import torch_npu

        return torch_npu.profiler.schedule(**kwargs)
    return torch.profiler.schedule(**kwargs)


def record_function(name: str, args: str | None = None) -> Any:
    import torch

    return torch.profiler.record_function(name, args)


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, use_gzip: bool = False) -> Any:
    if _real_npu():
        import torch_npu

        return torch_npu.profiler.tensorboard_trace_handler(dir_name, worker_name)
    import torch

    return torch.profiler.tensorboard_trace_handler(dir_name, worker_name, use_gzip)
