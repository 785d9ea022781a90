"""torchvision's PyPI wheel links its C++ ops against the CUDA torch; with the CPU torch they do not load and
``import torchvision`` fails where its meta registrations look the ops up. Defining the ops' schemas first
(torch.library, the same schemas torchvision's C++ registers) lets torchvision and timm import; the
classification and segmentation models the tests build never call these ops. Call ``install()`` before the
first ``import torchvision`` / ``import timm``."""
from __future__ import annotations

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) "
    "-> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_LIBRARY = None


def install() -> None:
    """Define the schemas once per process (a no-op when torchvision's own ops are loaded)."""
    global _LIBRARY
    import torch

    if _LIBRARY is not None or _has("nms"):
        return
    _LIBRARY = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - kept alive for the process
    for schema in SCHEMAS:
        _LIBRARY.define(schema)


def _has(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


class _BeforeTorchvision:
    """A meta-path finder that defines the schemas when ``torchvision`` is first imported (by a test, timm or
    transformers' image processors) and then lets the normal import proceed."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "torchvision":
            import sys

            sys.meta_path[:] = [f for f in sys.meta_path if f is not _BeforeTorchvision]
            install()
        return None


def install_on_import() -> None:
    """Arrange for ``install()`` to run just before the first ``import torchvision`` of this process."""
    import sys

    if _BeforeTorchvision not in sys.meta_path and "torchvision" not in sys.modules:
        sys.meta_path.insert(0, _BeforeTorchvision)
