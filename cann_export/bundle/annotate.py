"""The annotate stage: metadata, provenance, ATC hints and module paths into the graph's metadata_props."""
from __future__ import annotations

from ..graph import module_paths
from ..context import ExportContext
from ..hooks import manager


def annotate(ctx: ExportContext) -> str | None:
    from ..graph.onnx_helpers import set_metadata
    from ..fs.jsonio import dumps

    ctx.provenance = manager.registry().provenance(ctx)
    ctx.metadata = {str(k): str(v) for k, v in ctx.options.metadata.items()}
    props = dict(ctx.metadata)
    props.update({f"cann_export.{k}": v for k, v in ctx.provenance.items()})
    if ctx.options.atc_hints:
        props["cann_export.atc_hints"] = dumps(dict(sorted(ctx.options.atc_hints.items())))
    if ctx.reports.quantization is not None:  # config, calibration digest, per-layer scales and zero points
        props["cann_export.quantization"] = dumps(ctx.reports.quantization.to_dict())
    set_metadata(ctx.onnx_model, props)
    module_paths.stamp(ctx.onnx_model, ctx.module_paths)
    module_paths.stamp_origins(ctx.onnx_model, ctx.module_origins)
    return f"{len(props)} metadata entries"
