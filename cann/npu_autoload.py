"""torch's device-backend autoload hook (entry point group ``torch.backends``, called by ``import torch``).

It does nothing unless ``CANN_EXPORT_NPU_SIM=1``: then ``import torch`` alone gives ``torch.npu``,
``.npu()`` and ``torch.npu.amp``, as torch_npu's own autoload does, with npu-sim (an emulated ``npu``
computing on the CPU) where the real torch_npu is not installed. Scripts written for torch_npu that never
import ``cann.torch`` (article 003) then run unchanged. Only ``os`` is imported until the opt-in is seen.
"""
from __future__ import annotations

import os

ENV = "CANN_EXPORT_NPU_SIM"


def autoload() -> None:
    value = os.environ.get(ENV, "")
    if value in ("", "0"):
        return
    if value != "1":
        raise ValueError(f"{ENV}={value!r}: set it to 1 for npu-sim on `import torch`, or unset it")
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        return  # the real torch_npu is installed: its own autoload entry point makes `npu` the Ascend device
    import cann.torch

    cann.torch.enable("npu-sim")
