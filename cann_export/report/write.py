"""Writing report.html: into a bundle being exported (the format's finalize, before the manifest, so the
file table lists it), and again from a finished bundle (``cann-export report``), its curve re-derived
from the bundle's stored inputs rather than read back."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fs import atomic
from . import html, view

if TYPE_CHECKING:
    from ..context import ExportContext

REPORT = "report.html"


def write_into(ctx: ExportContext, staging: Path) -> Path:
    """report.html of the export in ``staging`` (its verdict, the curve the validate stage computed)."""
    from ..bundle.manifest import build_manifest

    page = view.build(build_manifest(ctx, None), ctx.reports.layers, view.node_places(ctx.onnx_model),
                      ctx.output_path.name)
    path = staging / REPORT
    atomic.write_text(path, html.render(page))
    return path


def regenerate(bundle: Path, output: Path | None = None) -> dict[str, Any]:
    """report.html of a finished bundle (checked like ``validate`` first: a bundle whose manifest does not
    re-derive is refused), written to ``output`` (default: ``<bundle>.report.html`` beside it: the bundle's
    own copy is covered by its manifest's digests and stays as written)."""
    import onnx

    from ..bundle import rederive
    from ..bundle.read import open_bundle
    from ..components.check import archive_is_multi, is_multi
    from ..errors import OptionsError, ValidateError
    from ..options import Tolerance

    bundle = Path(bundle)
    if is_multi(bundle) or archive_is_multi(bundle):
        where = f"{bundle}/components/NAME" if bundle.is_dir() else "components/NAME of the unzipped bundle"
        raise OptionsError("a multi-graph bundle has one report per graph: pass a component directory, "
                           f"{where} (each holds its own report.html)", path=bundle)
    target = Path(output) if output is not None else bundle.with_name(bundle.name.split(".")[0] + ".report.html")
    with open_bundle(bundle) as (directory, container):
        checked = rederive.check_bundle(directory, container=container)
        try:
            report, diffs = rederive.rederive_parity(checked, Tolerance(), False, layers=True)
        except ValidateError as e:
            e.stage = "report"
            raise
        if diffs:
            raise rederive.BundleMismatchError(diffs, path=bundle)
        model = onnx.load(str(directory / checked.manifest["model"]["file"]), load_external_data=False)
        page = view.build(checked.manifest, report.get("layers"), view.node_places(model), bundle.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(target, html.render(page))
    layers = page.get("layers") or {}
    return {"report": str(target), "bundle": str(bundle), "passed": page["verdict"]["passed"],
            "layers": len(layers.get("points") or [])}
