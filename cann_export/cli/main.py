"""The ``cann-export`` command: a thin layer over the Python API that prints and sets exit codes."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from ..errors import EXIT_PARITY_FAILED
from ..fs.jsonio import dumps as to_json
from ..safe_text import terminal
from ..bundle.coverage import on_verdict as covered
from ..validators.cost import checks_line
from .ci_reports import CiReports, bundle_manifest, ci_options, component_manifests
from ..usage.examples import examples
from .guard import DefaultCommandGroup
from .export_options import export_options, to_api_kwargs
from .fix_view import component_fix_line, fix_rerun_line
from .progress_view import ProgressView
from .warnings_view import print_warnings, quiet_progress_bars
from .lint_fix_view import print_lint_fixes
from ..usage.spellings import model_option, one_model
from ..usage.surface import as_cli


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=examples("cann-export model.pt2 --format atc_ready", "cann-export inspect model_atc_ready",
                             "cann-export validate model_atc_ready --junit junit.xml", "cann-export export --help"))
@click.version_option(package_name="cann-export", prog_name="cann-export")
def cli() -> None:
    """Export PyTorch models to ONNX and ATC-ready bundles for Huawei Ascend NPUs.

    `cann-export MODEL ...` is short for `cann-export export MODEL ...`.
    """
    context = click.get_current_context()
    context.with_resource(as_cli())  # errors name flags, not export()'s arguments
    if context.invoked_subcommand != "export":  # only an export loads a model: the others collect as usual
        from .. import collector

        collector.settle()


@cli.command("export", epilog=examples(
    "# one .onnx file (`cann-export MODEL ...` is short for `cann-export export MODEL ...`)",
    "cann-export export model.pt2 --format onnx -o model.onnx",
    "# a bundle for ATC (model, shapes and target)",
    "cann-export model.pt2 -o resnet_bundle --soc-version Ascend910B1 --precision-mode allow_mix_precision",
    "# loading: a state_dict with the class that builds the module",
    "cann-export weights.safetensors --model-class mypkg.nets:build --model-kwargs '{\"width\": 64}'",
    "# shapes: a dynamic batch as ATC gears",
    "cann-export model.pt2 --input-shape x:1,3,224,224 --dynamic x:0=batch:1,2,4,8",
    "# parity: real samples; keep what fp16 breaks in fp32",
    "cann-export model.pt2 --parity-data samples.npz --fix-precision",
    "# quantization-aware training to int8",
    "cann-export model.pt2 --qat --calibration-data batches.safetensors --qat-steps 200",
    "# the model zoo, and CI reports",
    "cann-export model.pt2 --publish resnet50 --zoo s3://models/zoo --summary summary.md --junit junit.xml"))
@click.argument("model", type=click.Path(dir_okay=True, path_type=str), required=False)
@model_option("MODEL")
@click.option("-o", "--output", type=click.Path(path_type=str),
              help="Output path (default: MODEL's stem + format suffix, in the current directory).")
@export_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result object on stdout.")
@click.option("-q", "--quiet", is_flag=True,
              help="No live progress line: one line per stage on stderr, as in a pipe or a CI log.")
@click.option("-v", "--verbose", is_flag=True, help="Show the third-party warnings (torch, transformers, ...) and "
              "progress bars that are otherwise counted in one line.")
@click.option("--trace", type=click.Path(path_type=str), default=None,
              help="Write the stage timeline to this file (Chrome trace JSON; opens in Perfetto).")
@ci_options
def export_cmd(model: str | None, model_opt: str | None, output: str | None, as_json: bool, quiet: bool,
               verbose: bool, trace: str | None, summary_file: str | None, junit_file: str | None,
               **values: Any) -> int:
    """Export MODEL (.pt2, TorchScript .pt, state_dict/checkpoint .pth, .safetensors) to FORMAT."""
    from .. import api, torchao_hidden

    click.get_current_context().with_resource(as_cli())  # also when run as `cann.torch.export`, without the group
    ci = CiReports("export", output or model or model_opt or "", summary_file, junit_file, as_json)
    with ci.refusal():  # refused before any verdict: CI still gets a failing test case naming the error
        model = one_model(model, model_opt)
        kwargs = to_api_kwargs(values)
        export_format = kwargs.pop("export_format")
        torchao_hidden.hide_for(model, kwargs)  # before transformers imports
        api.check_options(export_format, kwargs)  # before graphs(), which may import torch for a directory
        quiet_progress_bars(verbose)
        out = ci.path = output or _default_output(model, export_format, api.graphs(model, kwargs) is not None)
        with ProgressView(live=not (as_json or quiet)) as view:  # closed however the export ends
            view.say(f"cann-export: {model} -> {out} ({export_format})")
            result = api.export(model, out, export_format, trace=trace, on_progress=view, **kwargs)
    if hasattr(result, "components"):  # a multi-graph bundle
        ci.emit(lambda: component_manifests(result.output))
        return _print_multi_export(result, as_json)
    if result.manifest.get("halted"):  # a DDP rank other than 0: rank 0 reports and writes
        click.echo(terminal(result.manifest["halted"]), err=True)
        return 0
    ci.emit(lambda: {None: result.manifest})
    if as_json:
        click.echo(to_json(result.to_dict()))
    else:
        _print_result(result, verbose)
    return 0 if result.ok else EXIT_PARITY_FAILED


def _print_multi_export(result: Any, as_json: bool) -> int:
    if as_json:
        click.echo(to_json(result.to_dict()))
        return 0 if result.ok else EXIT_PARITY_FAILED
    atc, manifests = "atc" in result.manifest, component_manifests(result.output)
    click.echo(f"wrote {terminal(result.output)} ({result.format}, {result.kind}: {len(result.components)} graphs"
               + (", one ATC command each in atc/convert.sh)" if atc else ", components/NAME/model.onnx)"))
    for name, c in result.components.items():
        if c["passed"] is None:
            click.echo(f"  {terminal(name)}: parity not validated (--no-validate)")
            continue
        device = "" if c["device_passed"] is None and not atc else ", device not emulated" \
            if c["device_passed"] is None else f", device {'ok' if c['device_passed'] else 'FAIL'}"
        verdict = f"parity {'passed' if c['passed'] else 'FAILED'}{covered(manifests.get(name))}"
        click.echo(f"  {terminal(name)}: {verdict} (fp32 {'ok' if c['fp32_passed'] else 'FAIL'}{device})")
        if cost := checks_line(((manifests.get(name) or {}).get("parity") or {}).get("checks")):
            click.echo(f"    {cost}")
        if name in (result.manifest.get("precision_fix") or {}):
            click.echo(f"    {component_fix_line(result.manifest['precision_fix'][name])}")
    if result.manifest.get("precision_fix") == {}:
        click.echo("--fix-precision: every component passes its device verdict without a keep set")
    if line := fix_rerun_line((result.manifest.get("pipeline") or {}).get("end_to_end")):
        click.echo(line)
    return 0 if result.ok else EXIT_PARITY_FAILED


def _default_output(model: str, export_format: str, several: bool = False) -> str:
    """MODEL's stem, in the current directory: ``STEM_FORMAT`` for a directory format or an export of several
    graphs (a directory of components), else the first path the format's ``targets`` makes of ``STEM``
    (``m.onnx`` for onnx)."""
    from pathlib import Path

    from ..hooks.contracts import Format, optional
    from ..hooks.manager import registry

    stem = os.path.splitext(os.path.basename(model.rstrip("/")))[0] or "model"
    if os.path.isdir(model):  # a directory's whole name (Qwen2.5-0.5B); a hub-cache folder or snapshot
        # (models--org--name/...): the repo's name, not a hash
        repo = next((p for p in reversed(Path(model).resolve().parts) if p.startswith("models--")), "")
        stem = repo.rsplit("--", 1)[-1] if repo.count("--") >= 2 else os.path.basename(model.rstrip("/")) or stem
    fmt = registry().formats().get(export_format)
    if fmt is None or fmt.is_directory or several:  # an unknown format is refused by export, naming the known ones
        return f"{stem}_{export_format}"
    targets = optional(fmt, Format, "targets")
    return str(targets(Path(stem))[0]) if targets else stem


def _print_result(result: Any, verbose: bool = False) -> None:
    info = result.info()
    click.echo(f"wrote {terminal(info.label or result.format)}: {terminal(result.output)} "
               f"({terminal(result.onnx['exporter'])} exporter, opset {result.onnx['opset']})")
    print_warnings(result.manifest, verbose)
    print_lint_fixes(result.manifest)
    for note in info.notes:
        click.echo(terminal(note))
    parity = result.parity
    if not parity:
        click.echo("parity: not validated (--no-validate)")
        return
    click.echo(f"parity: {'passed' if parity['passed'] else 'FAILED'}{covered(result.manifest)} "
               f"({parity['input_sets']} input sets, reference: {terminal(parity['reference'])})")
    if cost := checks_line(((result.manifest or {}).get("parity") or {}).get("checks")):
        click.echo(cost)
    if precision := parity.get("precision"):
        device = precision.get("device_model") or {}
        on = f" on {device['soc_version']} ({device['overflow_mode']} overflow)" if device.get("soc_version") else ""
        click.echo(f"device precision: {terminal(precision.get('mode') or precision.get('reason'))}{on} (emulated: "
                   f"{precision.get('emulated')})")
    sections = [("fp32", parity.get("fp32") or {"outputs": parity["outputs"], "tolerance": parity.get("tolerance")})]
    if parity.get("device"):
        sections.append((f"device ({parity['device'].get('mode')})", parity["device"]))
    for title, section in sections:
        tol = ", ".join(f"{k}={v:g}" for k, v in (section.get("tolerance") or {}).items()
                        if isinstance(v, (int, float)))
        click.echo(f"  {title}" + (f" [{tol}]" if tol else ""))
        for o in section["outputs"]:
            mark = "ok  " if o["passed"] else "FAIL"
            click.echo(f"    {mark} {terminal(o['name'])}: max_abs={_num(o.get('max_abs'))} max_rel="
                       f"{_num(o.get('max_rel'))} cosine={_num(o.get('cosine'), '.6f')}"
                       + (f" ({terminal(o['reason'])})" if o.get("reason") else ""))
    if parity.get("probes"):
        click.echo(f"  specialisation probes ({parity['probes']['input_sets']} sets, judged relative to their own "
                   f"output): {'ok' if parity['probes']['passed'] else 'FAILED'}")
    for f in (parity.get("failing_sets") or [])[:5]:
        click.echo(f"    FAIL {terminal(f['output'])} on {f['role']} set {f['set']} ({f['kind']}): "
                   f"max_abs={_num(f.get('max_abs'))} cosine={_num(f.get('cosine'), '.6f')}")
    if parity.get("first_divergence"):
        click.echo(terminal(parity["first_divergence"]["message"]))
    if parity.get("trace_specialized"):
        from ..capture.trace_warnings import short_line

        click.echo(terminal(short_line(parity["trace_specialized"])))
    _print_fix(parity)
    if not parity["passed"]:
        if parity.get("reason"):
            click.echo(f"parity failed: {terminal(parity['reason'])}", err=True)
        click.echo("parity failed: the artifact was written with the failure recorded in its manifest", err=True)


def _print_fix(parity: dict[str, Any]) -> None:
    """What --fix-precision kept (how many ops, their share of the graph's FLOPs, whole modules), or why not."""
    fix = (parity.get("precision") or {}).get("fix")
    kept = parity.get("fixed_by_keep_dtype") or []
    if kept and fix and "kept_ops" in fix:
        shown = ", ".join(map(terminal, kept[:6])) + (f", ... ({len(kept) - 6} more)" if len(kept) > 6 else "")
        modules = f"; whole modules: {', '.join(map(terminal, fix['kept_modules']))}" if fix.get("kept_modules") else ""
        click.echo(f"--fix-precision kept {fix['kept_ops']} of {fix['graph_ops']} ops in fp32 "
                   f"({fix['kept_flops_share']:.1%} of the graph's FLOPs): {shown}{modules} (atc/keep_dtype.cfg)")
    elif kept:
        click.echo(f"--fix-precision kept in fp32: {', '.join(map(terminal, kept))} (atc/keep_dtype.cfg)")
    written = (fix or {}).get("written_as") or {}
    if written.get("op_types"):
        click.echo(f"--fix-precision wrote {', '.join(map(terminal, written['op_types']))} as OpType:: entries (every "
                   f"node of the type is kept; ATC's fusion may rename them) and {len(written['names'])} node(s) by "
                   "name in atc/keep_dtype.cfg")
    if fix and not fix["fixed"]:
        click.echo(f"--fix-precision cannot fix this: {terminal(fix['reason'])}")


def _num(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


@cli.command("validate", epilog=examples(
    "cann-export validate resnet_bundle",
    "cann-export validate model.pth --soc-version Ascend310P3 --soc-version Ascend910B1 --junit junit.xml",
    "cann-export validate resnet_bundle --expect-sha256 3f2a... --json"))
@click.argument("bundle", type=click.Path(path_type=str))
@click.option("--atol", type=float, default=None,
              help="Validate under this absolute tolerance instead of the tool's policy.")
@click.option("--rtol", type=float, default=None,
              help="Validate under this relative tolerance instead of the tool's policy.")
@click.option("--min-cosine", type=float, default=None,
              help="Validate under this minimum cosine instead of the tool's policy.")
@click.option("--expect-sha256", default=None, metavar="HEX",
              help="Refuse unless manifest.json has this sha256 (pin a bundle).")
@click.option("--soc-version", "soc_versions", multiple=True, metavar="SOC",
              help="Judge the device precision for this SoC's overflow mode (repeat for several; one verdict each).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result object on stdout.")
@ci_options
def validate_cmd(bundle: str, atol: float | None, rtol: float | None, min_cosine: float | None,
                 expect_sha256: str | None, soc_versions: tuple[str, ...], as_json: bool, summary_file: str | None,
                 junit_file: str | None) -> int:
    """Re-derive an atc_ready/om BUNDLE's verdicts: files, graph, ATC command and cfg files, parity.

    Exit 0: everything re-derived and parity passed; 1: parity fails under the tolerance used; 2: the
    bundle differs from its manifest (each difference is listed) or is malformed."""

    from .. import api
    from ..bundle.manifest_build import summarize_parity

    ci = CiReports("validate", bundle, summary_file, junit_file, as_json)
    with ci.refusal():
        report = api.validate(bundle, atol=atol, rtol=rtol, min_cosine=min_cosine, expect_sha256=expect_sha256,
                              soc_versions=list(soc_versions))
    if "components" in report:  # a multi-graph bundle: one verdict per graph
        ci.emit(lambda: {name: _validated(manifest, report["components"][name])
                         for name, manifest in component_manifests(bundle).items()})
        return _print_multi_validate(bundle, report, as_json)
    ci.emit(lambda: {None: _validated(bundle_manifest(bundle), report)})
    summary = summarize_parity(report)
    if as_json:
        click.echo(to_json({"ok": report["passed"], "bundle": bundle, "manifest_sha256": report["manifest_sha256"],
                            "parity": summary, **({"socs": report["socs"]} if "socs" in report else {})}))
    else:
        click.echo(f"{terminal(bundle)}: parity {'passed' if report['passed'] else 'FAILED'} (re-derived; "
                   f"manifest sha256 {report['manifest_sha256']})")
        for o in summary["outputs"]:
            click.echo(f"  {terminal(o['name'])}: max_abs={o['max_abs']:.3g} cosine={o['cosine']:.6f} "
                       f"{'ok' if o['passed'] else 'FAIL'}")
        if not report["passed"] and report.get("reason"):  # e.g. a trace specialised to its path, outputs all ok
            click.echo(f"  why: {terminal(str(report['reason']))}")
        if "stored" in summary:
            click.echo(f"  {_stored_note(summary)}")
        for v in report.get("socs", []):
            where = (v.get("first_divergence") or {}).get("message")
            tail = (f"; {where}" if where and not v["passed"] else "") + (f" [{v['note']}]" if "note" in v else "")
            click.echo("  " + terminal(f"{v['soc_version']} ({v['overflow_mode']} overflow): "
                                       f"{'passed' if v['passed'] else 'FAILED'}{tail}"))
    return 0 if report["passed"] else EXIT_PARITY_FAILED


def _validated(manifest: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The re-derived verdict in a manifest's shape, with the bundle's (re-derived, equal) ATC command."""
    from ..bundle.manifest_build import summarize_parity

    return {"model": manifest.get("model"), "atc": manifest.get("atc"), "parity": summarize_parity(report),
            **({"socs": report["socs"]} if "socs" in report else {})}


def _stored_note(parity: dict[str, Any]) -> str:
    """What validate could not re-run: the shapes whose parity sets the bundle did not store (``stored``)."""
    from ..bundle.parity_store import left_out_words

    stored = parity["stored"]
    shapes = terminal(left_out_words(stored["left_out"]))
    return (f"re-derived on {len(stored['input_sets'])} of {stored.get('of')} input sets (not stored, past "
            f"--stored-parity-mib {stored.get('cap_mib')}: {shapes}; their export verdicts are in manifest.json)")


def _print_multi_validate(bundle: str, report: dict[str, Any], as_json: bool) -> int:
    from ..bundle.manifest_build import summarize_parity

    parts = {name: {"passed": r["passed"], "manifest_sha256": r["manifest_sha256"], "parity": summarize_parity(r),
                    **({"socs": r["socs"]} if "socs" in r else {})} for name, r in report["components"].items()}
    if as_json:
        click.echo(to_json({"ok": report["passed"], "bundle": bundle, "kind": report.get("kind"),
                            "manifest_sha256": report["manifest_sha256"], "components": parts}))
    else:
        click.echo(f"{terminal(bundle)}: {len(parts)} graphs, parity {'passed' if report['passed'] else 'FAILED'} "
                   f"(re-derived; manifest sha256 {report['manifest_sha256']})")
        for name, part in parts.items():
            device = (part["parity"].get("device") or {}).get("passed")
            click.echo(f"  {terminal(name)}: {'passed' if part['passed'] else 'FAILED'} (fp32 "
                       f"{'ok' if part['parity'].get('fp32', {}).get('passed') else 'FAIL'}, device "
                       f"{'ok' if device else 'FAIL' if device is False else 'n/a'})"
                       + (f"; {_stored_note(part['parity'])}" if part["parity"].get("stored") else ""))
    return 0 if report["passed"] else EXIT_PARITY_FAILED


@cli.command("inspect", epilog=examples("cann-export inspect resnet_bundle", "cann-export inspect model.om --json",
                                         "cann-export inspect model.onnx"))
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the whole inspect object as JSON on stdout.")
def inspect_cmd(path: str, as_json: bool) -> int:
    """Show what a bundle, a single-file bundle, an om-stub, a multi-graph bundle or an .onnx file holds: the
    graph, the target SoC and precision mode, the ATC command and cfg files, lint findings and the verdict
    recorded at export, checked against the bundle's files first."""

    from .. import api

    info = api.inspect(path)
    if as_json:
        click.echo(to_json(info))
        return 0
    from .inspect_view import render

    click.echo("\n".join(map(terminal, render(info))))
    return 0


@cli.command("plugins", epilog=examples("cann-export plugins",
                                         "CANN_EXPORT_LOAD_PLUGINS=my-format cann-export plugins --json"))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list on stdout.")
def plugins_cmd(as_json: bool) -> int:
    """List the plugins with their versions and hooks."""

    from ..hooks.manager import describe_plugins

    rows = describe_plugins()
    if as_json:
        click.echo(to_json(rows))
    else:
        for row in rows:
            kind = "built-in" if row["builtin"] else "third-party"
            click.echo(terminal(f"{row['name']} {row['version']} ({kind}): {', '.join(row['hooks'])}"))
    return 0


def _register_plugin_commands() -> None:
    from ..hooks.manager import registry

    registry().add_commands(cli)


def _start() -> None:
    from .. import collector, torchao_hidden
    from ..sandbox.child import note_process_start

    note_process_start()
    torchao_hidden.own_process()  # an export of a directory may then hide torchao (torchao_hidden.py)
    collector.hold()  # off while the libraries and the model load; an export settles it (collector.py)
    # before torch (and its OpenMP) loads: a thread waiting at a parallel region's end sleeps instead of spinning.
    # On cores shared with other work a spinning thread holds the core its late peer needs: ViT-small's 7 eager
    # forwards took 4.4-9.0 s instead of 1.3 s on a shared 2-core machine. A value the user set is kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not os.environ.get("CANN_EXPORT_DEBUG"):
        import warnings

        warnings.filterwarnings("ignore")  # library chatter (tracer, deprecations) is not for CLI users


def _leave(code: Any) -> None:
    """Exit with ``code`` as ``sys.exit`` would. Once torch is imported, the interpreter's teardown (freeing
    thousands of modules, torch's and onnxruntime's static state) costs ~1 s of wall and CPU for nothing: the
    atexit handlers run and the streams are flushed, then the process ends without it. A Python thread
    still working (not a daemon) gets the ordinary exit, which waits for it."""
    import threading

    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if "torch" not in sys.modules or others:
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        click.echo(terminal(code), err=True)
        code = 1
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # what C++ libraries printed through stdio (os._exit skips its flush)
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(code or 0)


def main() -> None:
    _start()
    try:
        _register_plugin_commands()
    except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not hide the CLI
        click.echo(f"warning: plugin commands not loaded: {terminal(e)}", err=True)
    try:
        cli()
    except SystemExit as e:
        _leave(e.code)


def export_main() -> None:
    """``cann.torch.export``: the articles' CI line (``cann.torch.export --model model.pth --format atc_ready``)
    as a command of its own, the same as ``cann-export export``."""
    _start()
    try:
        export_cmd.main(prog_name="cann.torch.export")
    except SystemExit as e:
        _leave(e.code)
