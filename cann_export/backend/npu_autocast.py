"""``torch.autocast("npu", dtype=torch.float16)`` on npu-sim: the AutocastPrivateUse1 dispatch key.

Cast lists (as on Ascend's AMP and torch's CUDA autocast):
- to the autocast dtype (fp16/bf16): the matmul / conv / linear family (``LOWER_PRECISION``);
- to fp32: softmax, log-softmax, the norms, exp/log/pow/sum/prod/cumsum and the losses (``FP32``);
- every other op runs in the dtype of its inputs (the key falls through).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

LOWER_PRECISION = ("mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d",
                   "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "_convolution", "convolution",
                   "prelu", "scaled_dot_product_attention")
FP32 = ("softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "group_norm",
        "batch_norm", "norm", "exp", "log", "pow", "sum", "prod", "cumsum", "mse_loss", "l1_loss",
        "smooth_l1_loss", "kl_div", "nll_loss", "cross_entropy_loss", "binary_cross_entropy_with_logits")
KEY = "AutocastPrivateUse1"
_libraries: list[Any] = []


def _kernel(op: Any, lower: bool) -> Any:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def cast(x: Any, dtype: torch.dtype) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
            return x.to(dtype)
        return x

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("npu") if lower else torch.float32
        args, kwargs = pytree.tree_map(lambda x: cast(x, dtype), (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """Fall through the autocast key by default; register the casting kernels of the two lists."""
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, KEY)
    casts = torch.library.Library("aten", "IMPL")
    for names, lower in ((LOWER_PRECISION, True), (FP32, False)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue  # out= / in-place variants keep their destination's dtype
                casts.impl(op, _kernel(op, lower), KEY)
    _libraries.extend([fallthrough, casts])


def uninstall() -> None:
    for lib in _libraries:
        lib._destroy()
    _libraries.clear()
