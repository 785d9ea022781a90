"""Writing a multi-graph bundle: each component exported by the single-graph pipeline (``api.export``, in the
format the chosen format's ``component_format`` declares: atc_ready for atc_ready, onnx_bundle for onnx) into
``components/<name>/`` of one staging directory, then the top-level ``manifest.json`` (schema
``cann-export/bundle/2``: the format, the components with the sha256 of their manifests, the connections, the
overall verdict and the file table) and, when the components are headed for ATC, ``atc/convert.sh`` (one ATC
command per graph, each the component's own script), then the whole directory committed in one rename (nothing
is left on failure)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atc.lint import DYNAMIC_HINTS
from .single_file import ARCHIVE_SUFFIXES
from ..errors import ExportError, OptionsError
from ..plan import Plan

SCHEMA = "cann-export/bundle/2"
COMPONENTS_DIR = "components"
CONVERT = "atc/convert.sh"


@dataclass
class MultiResult:
    """What a multi-graph export produced: ``ok`` only when no component's parity (fp32 and device) failed
    (``--no-validate``: none was run)."""

    ok: bool
    output: str
    kind: str
    components: dict[str, dict[str, Any]]
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)
    manifest_sha256: str | None = None
    format: str = "atc_ready"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "format": self.format, "output": self.output, "kind": self.kind,
                "components": self.components, "connections": self.manifest.get("connections", []),
                "parity": self.manifest.get("parity", {}), "manifest_sha256": self.manifest_sha256,
                **({"precision_fix": self.manifest["precision_fix"]} if "precision_fix" in self.manifest else {})}


def convert_script(names: list[str]) -> str:
    """The top-level ATC script: every component's own ``atc/convert.sh`` (one ATC command each), in order;
    extra arguments go to every command. A function of the component names only, so validate re-derives it."""
    lines = ["#!/usr/bin/env bash",
             "# Converts every graph of this bundle to an Ascend offline model (.om), one ATC command per graph.",
             "# Run on a machine with CANN installed; each graph's .om is written in its own directory.",
             "set -euo pipefail", 'cd "$(dirname "$0")/.."']
    lines += [f'bash {shlex.quote(f"{COMPONENTS_DIR}/{n}/atc/convert.sh")} "$@"' for n in names]
    return "\n".join(lines) + "\n"


def export_plan(plan: Plan, output: str | Path, export_one: Any, *, overwrite: bool = False, progress: Any = None,
                metadata: dict[str, str] | None = None, carried: dict[str, bytes] | None = None,
                sandbox_record: dict[str, Any] | None = None, model_name: str | None = None,
                **options: Any) -> MultiResult:
    """Export every component of ``plan`` with ``export_one`` (api.export) into one bundle at ``output`` (see
    the module docstring). ``options`` are export()'s keyword options, applied to every component;
    ``carried``: files written beside the components (a model directory's config and tokenizer files,
    ``{"hf/NAME": bytes}``); ``model_name``: what the pages name the model (default: the output's name)."""
    from ..fs import atomic, digests
    from ..fs.jsonio import dumps

    from .graph_gear_hints import with_gears
    from .graph_ranges import component_hints, narrow, parse_ranges

    fmt, component = _check(plan, Path(output), options)
    ranges = parse_ranges(options.pop("dynamic", None))
    narrow(plan, ranges)  # the user's ranges and gears, before anything is written
    hints = with_gears(plan, ranges, component_hints(plan, options.pop("atc_hints", None)))
    combos = options.get("parity_coverage") == "full"  # --parity full: every gear / range-end combination
    full = bool(options.pop("parity_full_ranges", False)) or combos  # past the element budget (inputs/parity_budget.py)
    output = Path(output)
    atomic.check_target(output, overwrite)
    staging = atomic.staging_dir(output)
    try:
        from .. import progress as events

        from ..report.naming import model_named

        results = {}
        for done, comp in enumerate(plan.components):
            with events.in_stage(f"component {comp.name}", done + 1, len(plan.components)):
                events.advance("components", done, len(plan.components))
            name = model_name or output.name.split(".")[0]
            with model_named(name), events.for_graph(comp.name):  # its pages and progress events name both
                results[comp.name] = _export_component(plan, comp, staging, export_one, progress, metadata,
                                                       {**options, "export_format": component.name,
                                                        "atc_hints": hints[comp.name]}, full)
        for rel, data in (carried or {}).items():  # names from hf.files.companions (an allow-list)
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if atc_headed(component):
            (staging / "atc").mkdir()
            script = staging / CONVERT
            atomic.write_text(script, convert_script([c.name for c in plan.components]))
            script.chmod(0o755)
        manifest = build_manifest(plan, results, staging, fmt)
        if sandbox_record is not None:  # where the model directory was loaded (confined or why not)
            manifest["sandbox"] = dict(sandbox_record)
        atomic.write_text(staging / "manifest.json", dumps(manifest))
        digest = digests.sha256_file(staging / "manifest.json")
        place(staging, output, overwrite)
        staging = None
    finally:
        _forget(plan)
        if staging is not None:
            atomic.discard(staging)
    summary = {name: component_summary(r.manifest, name) for name, r in results.items()}
    return MultiResult(ok=multi_ok(manifest), output=str(output), kind=plan.kind, components=summary,
                       manifest=manifest, manifest_sha256=digest, format=fmt)


def _forget(plan: Plan) -> None:
    """What the components' exports shared, let go once the bundle is written: the references later components took
    their inputs from (bundle/parity_reuse.py) and each component's sizes for the parity budget."""
    plan.kept.clear()
    plan.sized.clear()


def component_format(name: Any) -> Any:
    """The registered Format the graphs of a multi-graph bundle in format ``name`` are written in (its
    ``component_format`` declaration), or None when that format holds no multi-graph bundle."""
    from ..hooks.contracts import Format, optional
    from ..hooks.manager import registry

    formats = registry().formats()
    fmt = formats.get(name) if isinstance(name, str) else None
    declared = optional(fmt, Format, "component_format") if fmt is not None else None
    inner = declared() if declared else None
    return formats.get(inner) if isinstance(inner, str) else None


def multi_formats() -> list[str]:
    """The registered formats a multi-graph export may be written in."""
    from ..hooks.manager import registry

    return sorted(n for n in registry().formats() if component_format(n) is not None)


def atc_headed(component: Any) -> bool:
    """Whether the components are headed for ATC (their format declares ATC's opsets): then the bundle has the
    top-level ``atc/convert.sh`` and ``cann-export convert`` compiles it."""
    return getattr(component, "atc_opsets", None) is not None


def _check(plan: Plan, output: Path, options: dict[str, Any]) -> tuple[str, Any]:
    fmt = options.pop("export_format", "atc_ready")
    return fmt, check_request(f"a multi-graph model ({plan.kind})", fmt, output, options)


def check_request(what: str, fmt: str, output: Path, options: dict[str, Any]) -> Any:
    """The component Format of a multi-graph export of ``what`` in format ``fmt`` to ``output``, or a refusal
    (checked before any load, and again when the plan is written)."""
    component = component_format(fmt)
    if component is None:
        raise OptionsError(f"{what} exports several graphs, as a bundle directory of components in --format "
                           f"{' or '.join(multi_formats())}, not --format {fmt}; pass --format atc_ready (then "
                           "`cann-export convert` compiles every graph) or --format onnx (the ONNX graphs, each "
                           "validated)")
    if options.get("publish"):
        raise OptionsError("--publish is not supported for a multi-graph export yet; export, then "
                           "`cann-export zoo publish BUNDLE NAME`")
    if Path(output).suffix and not one_file(output):
        raise OptionsError(f"a multi-graph bundle is a directory, or one file named {' / '.join(ARCHIVE_SUFFIXES)}"
                           f"; pass an output without a suffix (or out.zip), not {Path(output).name}", path=output)
    return component


def one_file(output: str | Path) -> bool:
    """Whether ``output`` names a single-file bundle (``x.zip``): the bundle directory zipped (bundle/single_file)."""
    return Path(output).suffix.lower() in ARCHIVE_SUFFIXES


def place(staging: Path, output: Path, overwrite: bool) -> None:
    """The finished bundle directory ``staging`` renamed into place at ``output``, or zipped into it (one file)."""
    from ..bundle.single_file import commit_archive
    from ..fs import atomic

    if one_file(output):
        commit_archive(staging, output, overwrite)
    else:
        atomic.commit_dir(staging, output, overwrite)


def _export_component(plan: Plan, comp: Any, staging: Path, export_one: Any, progress: Any,
                      metadata: dict[str, str] | None, options: dict[str, Any], full: bool = False) -> Any:
    """One component into ``staging/components/<name>``; its dynamic axes get ATC ranges (its ``dim_bounds``)
    in the form the target CANN takes unless its hints (``options["atc_hints"]``: the common ones and its own)
    give a dynamic form; an error names the component."""
    where = staging / COMPONENTS_DIR / comp.name
    where.parent.mkdir(exist_ok=True)
    hints = dict(options.get("atc_hints") or {})
    shaped = any(h in hints for h in (*DYNAMIC_HINTS, "input_shape"))
    if getattr(comp.module, "graph_dynamic_axes", None) and not shaped and atc_headed(component_format(
            options["export_format"])):
        from ..atc.dynamic_form import range_cann
        from ..options import ExportOptions

        if range_cann(options.get("cann_version") or ExportOptions.cann_version):  # CANN 8: ranges in --input_shape
            hints["input_shape"] = comp.module.shape_ranges(comp.example_inputs, brackets=False)
        else:
            hints["input_shape_range"] = comp.module.shape_ranges(comp.example_inputs)
    from .graph_shapes import shape_sets

    combos = options.get("parity_coverage") == "full"
    comp.module.graph_shape_sets = shape_sets(plan, comp, hints, full, combos)  # parity at the dynamic sizes / gears
    try:
        return export_one(comp.module, where, example_inputs=comp.example_inputs,
                          progress=_prefixed(progress, comp.name), metadata=dict(metadata or {}),
                          **{**options, "atc_hints": hints})
    except ExportError as e:
        e.args = (f"component {comp.name!r}: {e.args[0] if e.args else e}",)
        if hasattr(e, "message"):
            e.message = f"component {comp.name!r}: {e.message}"
        raise
    finally:  # the outputs kept for later graphs (bundle/parity_reuse.py) that none left to export reads
        from .parity_reuse import release

        release(plan, {c.name for c in plan.components[:plan.components.index(comp) + 1]})


def _prefixed(progress: Any, name: str) -> Any:
    if progress is None:
        return None

    def report(index: int, stage: str, status: str, seconds: float) -> None:
        progress(index, f"{name}:{stage}", status, seconds)

    return report


def component_summary(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """A component's entry in the top-level verdict: fp32 and device parity, from its own manifest."""
    parity = manifest.get("parity") or {}
    fp32 = (parity.get("fp32") or {}).get("passed") if isinstance(parity.get("fp32"), dict) else None
    device = (parity.get("device") or {}).get("passed") if isinstance(parity.get("device"), dict) else None
    passed = parity.get("passed") if isinstance(parity.get("passed"), bool) else None  # None: not validated
    return {"passed": passed, "fp32_passed": fp32, "device_passed": device,
            "path": f"{COMPONENTS_DIR}/{name}"}


def multi_ok(manifest: dict[str, Any]) -> bool:
    """An export's verdict from its (checked) top-level manifest: no component failed its parity (one exported
    with --no-validate records none)."""
    whole = ((manifest.get("pipeline") or {}).get("end_to_end") or {}).get("passed")  # a pipeline's (diffusion/)
    return whole is not False and all(v is not False for v in (manifest["parity"].get("components") or {}).values())


def build_manifest(plan: Plan, results: dict[str, Any], root: Path, fmt: str = "atc_ready") -> dict[str, Any]:
    from ..fs import digests
    from .multi_precision import precision_fixes

    components = []
    for comp in plan.components:
        m = results[comp.name].manifest
        components.append({
            "name": comp.name, "role": comp.role, "path": f"{COMPONENTS_DIR}/{comp.name}",
            "manifest_sha256": digests.sha256_file(root / COMPONENTS_DIR / comp.name / "manifest.json"),
            "inputs": [v["name"] for v in m["model"]["inputs"]], "outputs": [v["name"] for v in m["model"]["outputs"]],
        })
    verdicts = {c.name: component_summary(results[c.name].manifest, c.name) for c in plan.components}
    first = results[plan.components[0].name].manifest
    extra = plan.finish(root, results) if plan.finish is not None else {}  # a pipeline's end-to-end check (diffusion/)
    fixes = precision_fixes({c.name: results[c.name].manifest for c in plan.components})  # --fix-precision's
    return {
        "schema": SCHEMA,
        "format": fmt,
        "kind": plan.kind,
        "components": components,
        "connections": [{"from": {"component": a, "output": o}, "to": {"component": b, "input": i}}
                        for a, o, b, i in [*plan.connections, *plan.host_connections]],
        "run": dict(plan.notes),
        "parity": {"passed": all(v["passed"] is True for v in verdicts.values()),
                   "components": {n: v["passed"] for n, v in verdicts.items()}},
        **({"atc": {"script": CONVERT, "soc_version": (first.get("atc") or {}).get("soc_version")}}
           if (root / CONVERT).is_file() else {}),
        "provenance": dict(first.get("provenance") or {}),
        "files": _file_table(plan, results, root),
        **({"precision_fix": fixes} if fixes is not None else {}),
        **extra,
    }


def _file_table(plan: Plan, results: dict[str, Any], root: Path) -> dict[str, dict[str, Any]]:
    """The bundle's files (fs/digests.file_table), a component's files taken from the table its own manifest has
    just recorded (each of GPT-2's graphs is 500 MB: hashed once, not twice) where the size on disk still agrees."""
    from ..fs import digests

    known: dict[str, dict[str, Any]] = {}
    for comp in plan.components:
        for rel, entry in (results[comp.name].manifest.get("files") or {}).items():
            path = root / COMPONENTS_DIR / comp.name / rel
            if isinstance(entry, dict) and path.is_file() and not path.is_symlink() \
                    and path.stat().st_size == entry.get("size"):
                known[f"{COMPONENTS_DIR}/{comp.name}/{rel}"] = dict(entry)
    table = {**digests.file_table(root, exclude=("manifest.json", *known)), **known}
    return dict(sorted(table.items()))
