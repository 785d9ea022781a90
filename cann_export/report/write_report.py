"""Writing report.html: into a bundle being exported (the format's finalize, before the manifest, so the
file table lists it), and again from a finished bundle (``cann-export report``), its curve re-derived
from the bundle's stored inputs rather than read back. Nothing but an export writes inside a bundle: a
regenerated page goes beside it (a multi-graph bundle's one page holds every component)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fs import atomic
from . import html, pipeline_view, view
from .naming import current_model

if TYPE_CHECKING:
    from ..context import ExportContext

REPORT = "report.html"


def write_into(ctx: ExportContext, staging: Path) -> Path:
    """report.html of the export in ``staging`` (its verdict, the curve the validate stage computed)."""
    from ..bundle.manifest_build import build_manifest

    model = current_model()
    name = ctx.output_path.name
    page = view.build(build_manifest(ctx, None), ctx.reports.layers, view.node_places(ctx.onnx_model), name,
                      model_name=model or name, component=name if model else None)
    path = staging / REPORT
    atomic.write_text(path, html.render(page))
    return path


def regenerate(bundle: Path, output: Path | None = None) -> dict[str, Any]:
    """report.html of a finished bundle (checked like ``validate`` first: a bundle whose manifest does not
    re-derive is refused), written to ``output`` (default: ``<bundle>.report.html`` beside it; for
    ``BUNDLE/components/NAME``, ``BUNDLE.NAME.report.html`` beside ``BUNDLE``). A multi-graph bundle gives one
    page with a section per component. ``output`` inside a bundle is refused (validate would refuse the bundle)."""
    from ..bundle.multi_check import archive_is_multi, is_multi

    bundle = Path(bundle)
    home = enclosing_multi(bundle)
    stem = bundle.name.split(".")[0]
    if home is not None:
        default = home.with_name(f"{home.name.split('.')[0]}.{bundle.name}.report.html")
    else:
        default = bundle.with_name(stem + ".report.html")
    target = Path(output) if output is not None else default
    _refuse_inside(target, home or bundle)
    if is_multi(bundle) or archive_is_multi(bundle):
        page, verdict, values = _multi_page(bundle)
    else:
        one = _component_view(bundle, bundle.name, home.name if home is not None else None,
                              bundle.name if home is not None else None)
        page, verdict, values = html.render(one), one["verdict"]["passed"], len((one.get("layers") or {}).get(
            "points") or [])
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(target, page)
    return {"report": str(target), "bundle": str(bundle), "passed": verdict, "layers": values}


def enclosing_multi(path: Path) -> Path | None:
    """The multi-graph bundle directory that ``path`` (``BUNDLE/components/NAME``) is a component of, if any."""
    from ..bundle.multi_write import COMPONENTS_DIR
    from ..bundle.multi_check import is_multi

    path = Path(path)
    if path.parent.name == COMPONENTS_DIR and is_multi(path.parent.parent):
        return path.parent.parent
    return None


def _refuse_inside(target: Path, bundle: Path) -> None:
    from ..errors import OptionsError

    if not bundle.is_dir():
        return
    root, where = bundle.resolve(), target.resolve()
    if where == root or root in where.parents:
        raise OptionsError(f"-o {target}: inside the bundle {bundle}; nothing but an export writes inside a bundle "
                           "(validate would refuse it); pass a path outside it, or leave -o out to write the page "
                           "beside the bundle", path=target)


def _multi_page(bundle: Path) -> tuple[str, bool, int]:
    """The one page of a multi-graph bundle (checked as validate checks it), its verdict and curve values."""
    from ..bundle.rederive import BundleMismatchError
    from ..bundle.multi_check import check_multi, opened_multi

    model = bundle.name.split(".")[0]
    with opened_multi(bundle) as directory:
        manifest, diffs = check_multi(directory)
        if diffs:
            raise BundleMismatchError(diffs, path=bundle)
        views = [_component_view(directory / c["path"], c["name"], model, c["name"], shown=bundle)
                 for c in manifest["components"]]
        pipeline = pipeline_view.build(directory, manifest)
    values = sum(len((v.get("layers") or {}).get("points") or []) for v in views)
    passed = manifest["parity"]["passed"] is True and (pipeline or {}).get("end_to_end", {}).get("passed") is not False
    return html.render_multi(model, manifest.get("format"), views, pipeline), passed, values


def _component_view(bundle: Path, title: str, model: str | None, component: str | None,
                    shown: Path | None = None) -> dict[str, Any]:
    """The view of one graph's bundle directory (or single-file bundle), its parity re-derived."""
    import onnx

    from ..bundle import rederive
    from ..bundle.read import open_bundle
    from ..errors import ValidateError
    from ..options import Tolerance

    with open_bundle(bundle) as (directory, container):
        checked = rederive.check_bundle(directory, container=container)
        try:
            report, diffs = rederive.rederive_parity(checked, Tolerance(), False, layers=True)
        except ValidateError as e:
            e.stage = "report"
            if component is not None and shown is not None:
                e.message, e.path = f"component {component!r}: {e.message}", str(shown)
            raise
        if diffs:
            raise rederive.BundleMismatchError(diffs, path=shown or bundle)
        graph = onnx.load(str(directory / checked.manifest["model"]["file"]), load_external_data=False)
        return view.build(checked.manifest, report.get("layers"), view.node_places(graph), title,
                          model_name=model or title, component=component)
