"""Re-deriving what a bundle's manifest claims, instead of reading it back.

``check_bundle`` re-checks the file table and the torch program (``program_check``), compares the graph (inputs,
outputs, op histogram, the metadata and provenance stamped into its ``metadata_props``) with the manifest, and
re-renders the ATC command and cfg files from the manifest's ATC options *after validating them* (hint normalisers,
an allowed SoC pattern, the file names fixed by this tool), then asks the Format the manifest names (and the one
that unpacked its container) what else its artifact holds (``check_artifact``); ``rederive_parity`` re-runs parity
under the tool's policy. Every difference is collected; any difference is a refusal (``BundleMismatchError``, exit 2).
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .. import options as _options
from ..errors import ExportError, ValidateError
from ..hooks.contracts import CheckedBundle, Container, Format, optional
from .dynamic_check import dynamic_differences
from .dynamic_check import short as _short
from .lint_check import lint_differences
from .parity_store import as_recorded, example_row, left_out_shapes
from .read import external_data_files

if TYPE_CHECKING:
    from ..options import Tolerance

SOC_PATTERN = _options.SOC_PATTERN  # the pattern an export checks --soc-version against
CFG_FILES = ("convert.sh", "keep_dtype.cfg", "fusion_switch.cfg", "aipp.cfg", "modify_mixlist.json",
             "customize_dtypes.cfg", "customize_dtypes.fix.cfg")
OUTPUT_STEM = "model"
_DOTTED = re.compile(r".*\..*")


class BundleMismatchError(ValidateError):
    """The bundle's manifest claims what its files do not show; ``differences`` lists each one."""

    def __init__(self, differences: list[str], *, path: Any = None, stage: str | None = None):
        shown = "; ".join(differences[:20]) + (f"; ... {len(differences) - 20} more" if len(differences) > 20 else "")
        super().__init__(f"the bundle does not match its manifest ({len(differences)} difference"
                         f"{'s' if len(differences) != 1 else ''}): {shown}. Nothing in it can be trusted; "
                         "export it again or restore the original", path=path, stage=stage)
        self.differences = list(differences)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "differences": self.differences}


def check_soc(soc: Any) -> str:
    if not isinstance(soc, str) or not SOC_PATTERN.fullmatch(soc):
        raise ValidateError(f"soc_version {soc!r} is not an Ascend SoC name like Ascend310P3 or Ascend910B "
                            f"(pattern {SOC_PATTERN.pattern})", stage="convert")
    return soc


def check_bundle(directory: Path, *, container: Container | None = None, raise_on_difference: bool = True,
                 stage: str | None = None, weights: bool = True) -> CheckedBundle:
    """Check a bundle directory against its manifest; see the module docstring. ``container``: the single
    file it came from (see ``read.open_bundle``), checked by the Format that unpacked it. ``weights=False``: the
    graph is read without its weights' bytes (``checked.model`` then runs nowhere) where no check reads them (no
    ATC section to lint, no artifact check of a format): the staged bundle's check before commit, whose file table
    already hashes every byte (GPT-2 small: 500 MB parsed for nothing, twice per graph)."""
    from ..graph import module_paths
    from .program_check import program_differences
    from .manifest_schema import has_atc
    from .read import file_problems, read_bundle

    manifest = read_bundle(directory)
    checked = CheckedBundle(directory=directory, manifest=manifest, container=container)
    diffs = checked.differences
    diffs.extend(file_problems(directory, manifest))
    diffs.extend(program_differences(directory, manifest))  # torch/program.pt2: checked, never loaded
    formats = artifact_formats(checked)
    skeleton = not weights and not has_atc(manifest) and not any(optional(f, Format, "check_artifact") for f in formats)
    checked.model = _load_graph(directory, manifest["model"]["file"], diffs, weights=not skeleton)
    if checked.model is not None:
        checked.module_paths = module_paths.collect(checked.model)
        diffs.extend(graph_differences(checked.model, manifest))
        if has_atc(manifest):
            _check_atc(checked)
            diffs.extend(lint_differences(checked))  # the recorded ATC lint, re-run on the graph
    for fmt in formats:
        check = optional(fmt, Format, "check_artifact")
        diffs.extend(check(checked) if check else [])
    if diffs and raise_on_difference:
        raise BundleMismatchError(diffs, path=directory, stage=stage)
    return checked


def artifact_formats(checked: CheckedBundle) -> list[Format]:
    """The Formats that know this artifact: the one its manifest names, and the one that unpacked its
    container (when another)."""
    from ..hooks.manager import registry
    from .read import format_of

    found = [format_of(checked.manifest, checked.directory)]
    if checked.container is not None and checked.container.format != found[0].name:
        found.append(registry().formats()[checked.container.format])
    return found


def _load_graph(directory: Path, model_file: str, diffs: list[str], weights: bool = True) -> Any:
    """The graph, its external data left on disk, read one weight at a time (``onnx.load`` held the file's bytes
    beside the parsed graph: two copies of the weights at commit's check of every export); ``weights=False``:
    without the weights' bytes (graph/onnx_stream.py)."""
    from ..graph.onnx_stream import load

    model_path = directory / model_file
    if not model_path.is_file() or model_path.is_symlink():
        return None
    try:
        return load(model_path, weights=weights, external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
        diffs.append(f"{model_file}: not a readable ONNX model ({type(e).__name__})")
        return None


def graph_differences(model: Any, manifest: dict[str, Any]) -> list[str]:
    """What the manifest says about the graph against the graph itself."""
    from ..graph.onnx_helpers import describe_values, op_histogram, opset_of
    from ..fs.atomic import is_safe_relpath
    from ..fs.jsonio import strip_ansi

    diffs = []
    listed = manifest.get("files") or {}
    for location in external_data_files(model):
        if not is_safe_relpath(location) or location not in listed:
            diffs.append(f"the graph reads external data from {location!r}, which is not a file of the bundle's "
                         "file table (refused)")
    facts = {"inputs": describe_values(model.graph.input), "outputs": describe_values(model.graph.output),
             "ops": op_histogram(model)}
    for key, actual in facts.items():
        claimed = manifest["model"].get(key)
        if json.loads(json.dumps(actual, default=str)) != claimed:
            diffs.append(f"model.{key}: the manifest says {_short(claimed)}, the graph has {_short(actual)}")
    opset = opset_of(model)
    if manifest["model"].get("opset", opset) != opset:
        diffs.append(f"model.opset: the manifest says {_short(manifest['model'].get('opset'))}, the graph imports "
                     f"opset {opset}")
    stamped_by = (manifest.get("provenance") or {}).get("exporter")  # stamped in the graph: checked below
    if stamped_by is not None and manifest["model"].get("exporter", stamped_by) != stamped_by:
        diffs.append(f"model.exporter: the manifest says {_short(manifest['model'].get('exporter'))}, the graph's "
                     f"provenance {stamped_by!r}")
    props = {strip_ansi(str(p.key)): strip_ansi(str(p.value)) for p in model.metadata_props}  # as in manifest.json
    metadata = manifest.get("metadata") or {}
    for key, value in metadata.items():
        if props.get(key) != value:
            diffs.append(f"metadata.{key}: the manifest says {value!r}, the graph's metadata_props {props.get(key)!r}")
    for key, value in props.items():
        if not _DOTTED.fullmatch(key) and key not in metadata:
            diffs.append(f"metadata.{key}: the graph holds {value!r}, the manifest nothing")
    provenance = manifest.get("provenance") or {}
    for key, value in provenance.items():
        stamped = props.get(f"cann_export.{key}")
        if stamped != str(value):
            diffs.append(f"provenance.{key}: the manifest says {str(value)!r}, the graph {stamped!r}")
    for key, value in props.items():
        name = key[len("cann_export."):]
        if key.startswith("cann_export.") and name not in provenance and name not in ("atc_hints", "quantization"):
            diffs.append(f"provenance.{name}: the graph holds {value!r}, the manifest nothing")
    atc = manifest.get("atc")
    if isinstance(atc, dict) and atc:
        try:
            stamped_hints = json.loads(props.get("cann_export.atc_hints") or "{}")
        except ValueError:
            stamped_hints = None
        if stamped_hints != json.loads(json.dumps(atc.get("hints") or {}, sort_keys=True, default=str)):
            diffs.append(f"atc.hints: the manifest says {_short(atc.get('hints'))}, the graph was exported with "
                         f"{_short(stamped_hints)}")
    return diffs


def atc_options(manifest: dict[str, Any], soc_version: str | None = None) -> Any:
    """ExportOptions holding the manifest's ATC options, each validated as an export validates them."""
    from ..atc import hints as atc_hints
    from ..options import PRECISION_MODES, ExportOptions

    atc = manifest["atc"]
    hints = dict(atc.get("hints") or {})
    precision = atc_hints.DEFAULT_PRECISION_MODE if "precision_mode_v2" in hints else atc["precision_mode"]
    if precision not in PRECISION_MODES:
        raise ValidateError(f"atc.precision_mode {precision!r} is not one ATC accepts")
    opts = ExportOptions(soc_version=atc["soc_version"], precision_mode=precision, atc_hints=hints)
    atc_hints.resolve(opts)  # normalises every hint, refuses unknown ones and combinations ATC refuses
    dynamic = atc.get("dynamic")
    if dynamic is not None:  # the graph's dynamic axes and the CANN release their ATC form was rendered for
        from ..dynamic import from_records
        from ..options import _is_version

        if not isinstance(dynamic, dict) or not _is_version(str(dynamic.get("cann_version"))):
            raise ValidateError("atc.dynamic is not {cann_version, form, axes}")
        opts.cann_version, opts.dynamic = str(dynamic["cann_version"]), from_records(dynamic.get("axes"))
    opts.soc_version = check_soc(soc_version or opts.soc_version)
    return opts


def render(checked: CheckedBundle, target: Path, soc_version: str | None = None) -> dict[str, Any]:
    """Render atc/ into ``target`` from the validated options; returns the ATC report (command included)."""
    from ..atc.command import render as render_atc
    from ..context import PrecisionFix, Reports

    opts = atc_options(checked.manifest, soc_version)
    kept = (checked.manifest.get("parity") or {}).get("fixed_by_keep_dtype") or []
    if not isinstance(kept, list) or not all(isinstance(k, str) for k in kept):
        raise ValidateError("parity.fixed_by_keep_dtype is not a list of node names")
    reports = Reports(precision_fix=PrecisionFix(list(kept)) if kept else None)
    ctx = SimpleNamespace(options=opts, onnx_model=checked.model, module_paths=checked.module_paths, reports=reports)
    render_atc(ctx, target, model_file=checked.manifest["model"]["file"], output_stem=OUTPUT_STEM)
    return {**reports.atc, "options": opts}


def _check_atc(checked: CheckedBundle) -> None:
    manifest, diffs = checked.manifest, checked.differences
    try:
        with tempfile.TemporaryDirectory(prefix="cann-export-render-") as tmp:
            report = render(checked, Path(tmp))
            for name in CFG_FILES:
                rendered, stored = Path(tmp) / "atc" / name, checked.directory / "atc" / name
                if rendered.is_file() != (stored.is_file() and not stored.is_symlink()):
                    diffs.append(f"atc/{name}: {'missing from the bundle' if rendered.is_file() else 'present'} "
                                 f"but the validated options {'need' if rendered.is_file() else 'do not need'} it")
                elif rendered.is_file() and rendered.read_bytes() != stored.read_bytes():
                    diffs.append(f"atc/{name}: differs from the one rendered from the validated options")
    except (ExportError, ValueError) as e:
        diffs.append(f"atc: the manifest's ATC options do not validate ({getattr(e, 'message', e)})")
        return
    atc = manifest["atc"]
    checked.options, checked.command = report["options"], report["command"]
    diffs.extend(dynamic_differences(checked))
    checked.keep_nodes = list((report.get("keep_dtype") or {}).get("nodes", []))
    if atc.get("command") is not None and atc["command"] != report["command"]:
        extra = [a for a in atc["command"] if a not in report["command"]]
        missing = [a for a in report["command"] if a not in atc["command"]]
        diffs.append(f"atc.command: the manifest says {_short(extra)} beyond and lacks {_short(missing)} of what "
                     "the validated options render" if extra or missing else
                     "atc.command: the manifest's arguments are in another order than the validated options render")
    stored_amct, rendered_amct = atc.get("amct"), report.get("amct")
    stored_cmd = stored_amct.get("command") if isinstance(stored_amct, dict) else stored_amct
    if stored_cmd != (rendered_amct or {}).get("command"):
        diffs.append(f"atc.amct.command: the manifest says {_short(stored_cmd)}, the graph and the validated options "
                     f"render {_short((rendered_amct or {}).get('command'))}")
    for key in ("soc_version", "precision_mode"):
        if atc.get(key) != report[key]:
            diffs.append(f"atc.{key}: the manifest says {atc.get(key)!r}, the validated options {report[key]!r}")
    stored = atc.get("keep_dtype", {})
    stored_keep = stored.get("nodes", []) if isinstance(stored, dict) else None
    if stored_keep != checked.keep_nodes:
        diffs.append(f"atc.keep_dtype: the manifest says {_short(stored_keep)}, the validated options keep "
                     f"{_short(checked.keep_nodes)}")


def rederive_parity(checked: CheckedBundle, tolerance: Tolerance, explicit: bool,
                    soc_versions: list[str] | None = None, layers: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Parity re-run from the stored inputs and reference outputs under ``tolerance`` (the tool's policy
    unless the user passed values), with the device-precision run the validated ATC options imply (under the
    device model the manifest records); and every way the manifest's parity section differs from what was
    re-derived. ``soc_versions``: judge the bundle for each of these SoCs too (``report["socs"]``, one verdict
    each; the overall verdict is theirs). ``layers``: add the device run's per-layer curve (report.html)."""
    recorded = checked.manifest["parity"]
    if not recorded["validated"]:
        raise ValidateError("the bundle holds no parity data (it was exported with --no-validate); "
                            "export again with validation to get re-runnable parity", path=checked.directory)
    if soc_versions and (checked.options is None or (recorded.get("precision") or {}).get("emulated") is False):
        raise ValidateError("--soc-version judges the device precision of an ATC bundle (atc_ready, om); this "
                            "bundle has no ATC options to emulate, or a graph too large to emulate (its export "
                            "skipped the emulation too)", path=checked.directory)
    report, mode, rerun = _rerun_parity(checked, tolerance, layers)
    _specialisation(report, checked.manifest)
    left_out = left_out_shapes(recorded, report.get("input_sets"), checked.directory)
    if left_out is not None:
        example_row(report, "quantization" in checked.manifest)
    used = tolerance.to_dict()
    claimed = recorded.get("tolerance") or {}
    changed = {k: v for k, v in claimed.items() if k in used and float(v) != float(used[k])}
    diffs = []
    if explicit and changed:  # the user chose another tolerance: the recorded verdict is not comparable
        report["recorded_tolerance"] = claimed
    else:
        diffs += [f"parity.tolerance.{key}: the manifest records {value!r}, validate used {used[key]!r} (the tool "
                  f"policy; pass --{key.replace('_', '-')} to validate under another value)"
                  for key, value in changed.items()]
        diffs += _verdict_differences(recorded, report, left_out or [])
    claimed_mode = (recorded.get("precision") or {}).get("mode")
    if mode is not None and claimed_mode is not None and claimed_mode != mode:
        diffs.append(f"parity.precision.mode: the manifest says {claimed_mode!r}, the validated ATC options "
                     f"give {mode!r}")
    if soc_versions:
        report["socs"] = [_soc_verdict(report, rerun, soc) for soc in dict.fromkeys(soc_versions)]
        report["passed"] = all(v["passed"] for v in report["socs"])
    if left_out is not None:
        as_recorded(report, recorded)
    return report, diffs


def _soc_verdict(report: dict[str, Any], rerun: dict[str, Any], soc: str) -> dict[str, Any]:
    """The device verdict of the bundle on ``soc`` (the re-derived run reused when its device model is the same)."""
    from ..options import soc_model
    from ..validators.int8_device import deq_scale_for
    from ..validators.parity import with_device_parity

    model = soc_model(soc)
    ran = (report.get("precision") or {}).get("device_model") or {}
    same = ran.get("overflow_mode") == model.overflow
    lists = (report.get("precision") or {}).get("mixed_lists")
    if lists:  # a mixed mode: the SoC family's lists too
        from ..atc.mixlists import family

        same = same and lists.get("family") == family(soc)
    if same and rerun and any(n.op_type == "QuantizeLinear" for n in rerun["model"].graph.node):
        same = deq_scale_for(ran.get("soc_version")) == deq_scale_for(soc)  # the int8 path's AscendDequant scale
    if same or "graph_fp32" not in report:
        verdict = report
    else:
        graph = report["graph_fp32"]
        base = {"passed": graph["passed"], "outputs": graph["outputs"], "tolerance": graph["tolerance"]}
        verdict = with_device_parity(base, rerun["model"], rerun["mode"], rerun["keep"], rerun["feeds"],
                                     rerun["expected"], rerun["tolerance"], rerun["paths"], soc=soc,
                                     float_expected=rerun.get("float_expected"), mixlist=rerun.get("mixlist"),
                                     custom=rerun.get("custom"))
    device = verdict.get("device") or {}
    entry = {**model.to_dict(), "passed": bool(verdict["passed"]),
             "device_passed": device.get("passed"), "outputs": [
                 {k: o[k] for k in ("name", "max_abs", "cosine", "passed", "reason") if k in o}
                 for o in device.get("outputs", [])]}
    if verdict.get("first_divergence"):
        entry["first_divergence"] = verdict["first_divergence"]
    return entry


def _rerun_parity(checked: CheckedBundle, tolerance: Tolerance,
                  layers: bool = False) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """The parity report re-run from the bundle's stored data, the device precision mode it used, and what the
    device run needs to run again for another SoC."""
    import onnx

    from ..inputs.parity_data import (read_bundle_float_outputs, read_bundle_int8_noise, read_bundle_labels,
                                      read_bundle_noise, read_bundle_parity)
    from ..validators.parity import example_shape, parity_report, verdict_sets, with_device_parity
    from .read import emulation_skipped

    manifest, directory = checked.manifest, checked.directory
    feeds, expected, _ = read_bundle_parity(directory, manifest)
    labels = read_bundle_labels(directory, len(feeds))
    model_path = directory / manifest["model"]["file"]
    if not model_path.is_file() or model_path.is_symlink():  # a FIFO would block onnxruntime's open()
        raise ValidateError(f"the bundle's graph {manifest['model']['file']!r} is not a regular file; the bundle was "
                            "changed after export", path=str(directory))
    report = parity_report(model_path, feeds, expected, tolerance, reference="stored reference outputs",
                           quantized="quantization" in manifest, labels=labels,
                           noise=read_bundle_noise(directory, len(feeds)),
                           quant_noise=read_bundle_int8_noise(directory, len(feeds)))
    skipped = emulation_skipped(manifest["parity"], checked.model, directory)  # a large graph's (large_graph.py)
    if checked.options is None or not report.get("outputs") or skipped:  # no device run: fp32 per shape
        from ..validators.shape_parity import add_shape_verdicts

        if report.get("outputs"):
            add_shape_verdicts(report, labels, None, None)
        if skipped:
            report["precision"] = dict(manifest["parity"]["precision"])
        return report, None, {}
    from ..atc.hints import effective_precision
    from ..validators.precision import INF_NAN

    mode = effective_precision(checked.options)
    precision = manifest["parity"].get("precision") or {}
    # the device model the export ran: a bundle written before SoC device models emulated Inf/NaN mode
    overflow = (precision.get("device_model") or {}).get("overflow_mode", INF_NAN)
    chosen = example_shape(labels, verdict_sets(labels or [], len(feeds)))  # the device sets, as at export
    floats = read_bundle_float_outputs(directory, expected) if "quantization" in manifest else None
    rerun = {"model": onnx.load(str(model_path)), "mode": mode, "keep": checked.keep_nodes,
             "feeds": [feeds[s] for s in chosen], "expected": [expected[s] for s in chosen], "tolerance": tolerance,
             "paths": checked.module_paths, "float_expected": [floats[s] for s in chosen] if floats else None,
             "mixlist": checked.options.atc_hints.get("modify_mixlist"),
             "custom": checked.options.atc_hints.get("customize_dtypes")}
    from ..validators.parity import shape_verdicts
    from ..validators.emulators import shared_emulators

    with shared_emulators(rerun["model"]):  # one Emulator for the device verdict and the other shapes'
        report = with_device_parity(report, rerun["model"], mode, checked.keep_nodes, rerun["feeds"],
                                    rerun["expected"], tolerance, checked.module_paths, soc=checked.options.soc_version,
                                    overflow=overflow, float_expected=rerun["float_expected"], layers=layers,
                                    mixlist=rerun["mixlist"], custom=rerun["custom"])
        report = shape_verdicts(report, labels, rerun["model"], checked.keep_nodes, feeds, expected, tolerance,
                                checked.module_paths, "quantization" in manifest)
    return report, mode, rerun


def _specialisation(report: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The export's rule for a traced graph specialised to the example's path: the verdict fails unless the user
    accepted it or the trace gate checked it (capture/trace_warnings.py), from the manifest's record of the capture.
    Without it, a bundle exported with --exporter torchscript and that failure re-derived as passing and validate
    refused it as not matching its manifest."""
    from ..capture.trace_warnings import apply_specialisation

    spec = (manifest.get("capture") or {}).get("specialized")
    if isinstance(spec, dict) and isinstance(spec.get("warnings"), list) and "accepted" in spec:
        apply_specialisation(report, spec, None)


def _verdict_differences(recorded: dict[str, Any], report: dict[str, Any], left_out: list[Any]) -> list[str]:
    """The recorded verdicts (overall, fp32 graph, per output, per device output) against the re-derived
    ones, like with like: the manifest stores the summary (fp32 outputs on top, device apart). A shape whose sets
    the parity data left out (``left_out``) has no re-derived verdict to compare."""
    from .manifest_build import summarize_parity

    diffs = []
    if recorded.get("passed") != report["passed"]:
        diffs.append(f"parity.passed: the manifest says {recorded.get('passed')}, re-derived {report['passed']}")
    if "graph_fp32_passed" in recorded and "graph_fp32" in report \
            and recorded["graph_fp32_passed"] != report["graph_fp32"]["passed"]:
        diffs.append(f"parity.graph_fp32_passed: the manifest says {recorded['graph_fp32_passed']}, re-derived "
                     f"{report['graph_fp32']['passed']}")
    rederived = summarize_parity(report)
    sections = (("parity.device.outputs", (recorded.get("device") or {}).get("outputs"),
                 (rederived.get("device") or {}).get("outputs", [])),
                ("parity.outputs", recorded.get("outputs"), rederived.get("outputs", [])))
    for where, claimed, derived in sections:
        got = {o["name"]: o.get("passed") for o in derived}
        for o in claimed or []:
            if isinstance(o, dict) and o.get("name") in got and o.get("passed") != got[o["name"]]:
                diffs.append(f"{where}[{o['name']}].passed: the manifest says {o.get('passed')}, re-derived "
                             f"{got[o['name']]}")
    claimed_shapes = recorded.get("shapes")
    derived_shapes = [{k: r.get(k) for k in ("shape", "fp32", "device", "passed")} for r in report.get("shapes") or []]
    if claimed_shapes is not None or derived_shapes:
        claimed = [{k: r.get(k) for k in ("shape", "fp32", "device", "passed")} if isinstance(r, dict) else r
                   for r in (claimed_shapes if isinstance(claimed_shapes, list) else [claimed_shapes])
                   if not (isinstance(r, dict) and r.get("shape") in left_out)]
        if claimed != derived_shapes:
            diffs.append(f"parity.shapes: the manifest says {_short(claimed)}, re-derived {_short(derived_shapes)}")
    return diffs
