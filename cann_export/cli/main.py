"""The ``cann-export`` command: a thin layer over the Python API that prints and sets exit codes."""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from ..errors import EXIT_PARITY_FAILED
from ..fs.jsonio import dumps as to_json
from .guard import DefaultCommandGroup
from .options import export_options, to_api_kwargs
from .spellings import model_option, one_model


def _progress(index: int, stage: str, status: str, seconds: float) -> None:
    from ..pipeline.table import STAGE_NAMES

    click.echo(f"[{index}/{len(STAGE_NAMES)}] {stage} ... {status} ({seconds:.2f}s)", err=True)


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cann-export", prog_name="cann-export")
def cli() -> None:
    """Export PyTorch models to ONNX and ATC-ready bundles for Huawei Ascend NPUs.

    `cann-export MODEL ...` is short for `cann-export export MODEL ...`.
    """


@cli.command("export")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str), required=False)
@model_option("MODEL")
@click.option("-o", "--output", type=click.Path(path_type=str),
              help="Output path (default: MODEL's stem + format suffix, in the current directory).")
@export_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result object on stdout.")
@click.option("--trace", type=click.Path(path_type=str), default=None,
              help="Write the stage timeline to this file (Chrome trace JSON; opens in Perfetto).")
def export_cmd(model: str | None, model_opt: str | None, output: str | None, as_json: bool, trace: str | None,
               **values: Any) -> int:
    """Export MODEL (.pt2, TorchScript .pt, state_dict/checkpoint .pth, .safetensors) to FORMAT."""

    from .. import api

    model = one_model(model, model_opt)

    kwargs = to_api_kwargs(values)
    export_format = kwargs.pop("export_format")
    out = output or _default_output(model, export_format)
    with _TrainProgress() as train_progress:  # closed however the export ends
        result = api.export(model, out, export_format, progress=_progress, trace=trace,
                            train_callback=train_progress if kwargs.get("quantize") == "qat" else None, **kwargs)
    if hasattr(result, "components"):  # a multi-graph bundle
        return _print_multi_export(result, as_json)
    if result.manifest.get("halted"):  # a DDP rank other than 0: rank 0 reports and writes
        click.echo(result.manifest["halted"], err=True)
        return 0
    if as_json:
        click.echo(to_json(result.to_dict()))
    else:
        _print_result(result)
    return 0 if result.ok else EXIT_PARITY_FAILED


def _print_multi_export(result: Any, as_json: bool) -> int:
    if as_json:
        click.echo(to_json(result.to_dict()))
    else:
        click.echo(f"wrote {result.output} ({result.kind}: {len(result.components)} graphs, one ATC command each "
                   f"in atc/convert.sh)")
        for name, c in result.components.items():
            click.echo(f"  {name}: parity {'passed' if c['passed'] else 'FAILED'} (fp32 "
                       f"{'ok' if c['fp32_passed'] else 'FAIL'}, device {'ok' if c['device_passed'] else 'FAIL'})")
    return 0 if result.ok else EXIT_PARITY_FAILED


class _TrainProgress:
    """A progress bar with the distillation loss, on stderr. Used as a context manager around the export,
    so the bar is closed however training ends (a raised error included)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __enter__(self) -> _TrainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.render_finish()
            self.bar = None

    def __call__(self, step: int, total: int, loss: float) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="qat fine-tuning", file=sys.stderr,
                                         item_show_func=lambda item: item, show_pos=True)
        self.bar.update(1, f"loss {loss:.4g}")
        if step >= total:
            self.__exit__(None, None, None)


def _default_output(model: str, export_format: str) -> str:
    """MODEL's stem, in the current directory: ``STEM_FORMAT`` for a directory format, else the first path
    the format's ``targets`` makes of ``STEM`` (``m.onnx`` for onnx)."""
    from pathlib import Path

    from ..hooks.contracts import Format, optional
    from ..hooks.manager import registry

    stem = os.path.splitext(os.path.basename(model.rstrip("/")))[0] or "model"
    if os.path.isdir(model):  # a directory's whole name (Qwen2.5-0.5B); a hub-cache folder or snapshot
        # (models--org--name/...): the repo's name, not a hash
        repo = next((p for p in reversed(Path(model).resolve().parts) if p.startswith("models--")), "")
        stem = repo.rsplit("--", 1)[-1] if repo.count("--") >= 2 else os.path.basename(model.rstrip("/")) or stem
    fmt = registry().formats().get(export_format)
    if fmt is None or fmt.is_directory:  # an unknown format is refused by export, naming the known ones
        return f"{stem}_{export_format}"
    targets = optional(fmt, Format, "targets")
    return str(targets(Path(stem))[0]) if targets else stem


def _print_result(result: Any) -> None:
    info = result.info()
    click.echo(f"wrote {info.label or result.format}: {result.output} ({result.onnx['exporter']} exporter, "
               f"opset {result.onnx['opset']})")
    for note in info.notes:
        click.echo(note)
    parity = result.parity
    if not parity:
        click.echo("parity: not validated (--no-validate)")
        return
    click.echo(f"parity: {'passed' if parity['passed'] else 'FAILED'} ({parity['input_sets']} input sets, "
               f"reference: {parity['reference']})")
    if parity.get("precision"):
        precision = parity["precision"]
        device = precision.get("device_model") or {}
        on = f" on {device['soc_version']} ({device['overflow_mode']} overflow)" if device.get("soc_version") else ""
        click.echo(f"device precision: {precision['mode']}{on} (emulated: {precision['emulated']})")
    sections = [("fp32", parity.get("fp32") or {"outputs": parity["outputs"], "tolerance": parity.get("tolerance")})]
    if parity.get("device"):
        sections.append((f"device ({parity['device'].get('mode')})", parity["device"]))
    for title, section in sections:
        tol = ", ".join(f"{k}={v:g}" for k, v in (section.get("tolerance") or {}).items()
                        if isinstance(v, (int, float)))
        click.echo(f"  {title}" + (f" [{tol}]" if tol else ""))
        for o in section["outputs"]:
            mark = "ok  " if o["passed"] else "FAIL"
            click.echo(f"    {mark} {o['name']}: max_abs={_num(o.get('max_abs'))} max_rel={_num(o.get('max_rel'))} "
                       f"cosine={_num(o.get('cosine'), '.6f')}" + (f" ({o['reason']})" if o.get("reason") else ""))
    if parity.get("probes"):
        click.echo(f"  specialisation probes ({parity['probes']['input_sets']} sets, judged relative to their own "
                   f"output): {'ok' if parity['probes']['passed'] else 'FAILED'}")
    for f in (parity.get("failing_sets") or [])[:5]:
        click.echo(f"    FAIL {f['output']} on {f['role']} set {f['set']} ({f['kind']}): "
                   f"max_abs={_num(f.get('max_abs'))} cosine={_num(f.get('cosine'), '.6f')}")
    if parity.get("first_divergence"):
        click.echo(parity["first_divergence"]["message"])
    if parity.get("trace_specialized"):
        spec = parity["trace_specialized"]
        from ..capture.trace_check import where

        click.echo("traced graph, specialised to the example's path "
                   f"({'accepted' if spec['accepted'] else 'not accepted'}): "
                   + "; ".join(where(f) for f in spec["warnings"][:3]))
    _print_fix(parity)
    if not parity["passed"]:
        if parity.get("reason"):
            click.echo(f"parity failed: {parity['reason']}", err=True)
        click.echo("parity failed: the artifact was written with the failure recorded in its manifest", err=True)


def _print_fix(parity: dict[str, Any]) -> None:
    """What --fix-precision kept (how many ops, their share of the graph's FLOPs, whole modules), or why not."""
    fix = (parity.get("precision") or {}).get("fix")
    kept = parity.get("fixed_by_keep_dtype") or []
    if kept and fix and "kept_ops" in fix:
        shown = ", ".join(kept[:6]) + (f", ... ({len(kept) - 6} more)" if len(kept) > 6 else "")
        modules = f"; whole modules: {', '.join(fix['kept_modules'])}" if fix.get("kept_modules") else ""
        click.echo(f"--fix-precision kept {fix['kept_ops']} of {fix['graph_ops']} ops in fp32 "
                   f"({fix['kept_flops_share']:.1%} of the graph's FLOPs): {shown}{modules} (atc/keep_dtype.cfg)")
    elif kept:
        click.echo(f"--fix-precision kept in fp32: {', '.join(kept)} (atc/keep_dtype.cfg)")
    if fix and not fix["fixed"]:
        click.echo(f"--fix-precision cannot fix this: {fix['reason']}")


def _num(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


@cli.command("validate")
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
@click.option("--json", "as_json", is_flag=True)
def validate_cmd(bundle: str, atol: float | None, rtol: float | None, min_cosine: float | None,
                 expect_sha256: str | None, soc_versions: tuple[str, ...], as_json: bool) -> int:
    """Re-derive an atc_ready/om BUNDLE's verdicts: files, graph, ATC command and cfg files, parity.

    Exit 0: everything re-derived and parity passed; 1: parity fails under the tolerance used; 2: the
    bundle differs from its manifest (each difference is listed) or is malformed."""

    from .. import api
    from ..bundle.manifest import summarize_parity

    report = api.validate(bundle, atol=atol, rtol=rtol, min_cosine=min_cosine, expect_sha256=expect_sha256,
                          soc_versions=list(soc_versions))
    if "components" in report:  # a multi-graph bundle: one verdict per graph
        return _print_multi_validate(bundle, report, as_json)
    summary = summarize_parity(report)
    if as_json:
        click.echo(to_json({"ok": report["passed"], "bundle": bundle, "manifest_sha256": report["manifest_sha256"],
                            "parity": summary, **({"socs": report["socs"]} if "socs" in report else {})}))
    else:
        click.echo(f"{bundle}: parity {'passed' if report['passed'] else 'FAILED'} (re-derived; manifest sha256 "
                   f"{report['manifest_sha256']})")
        for o in summary["outputs"]:
            click.echo(f"  {o['name']}: max_abs={o['max_abs']:.3g} cosine={o['cosine']:.6f} "
                       f"{'ok' if o['passed'] else 'FAIL'}")
        for v in report.get("socs", []):
            where = (v.get("first_divergence") or {}).get("message")
            tail = (f"; {where}" if where and not v["passed"] else "") + (f" [{v['note']}]" if "note" in v else "")
            click.echo(f"  {v['soc_version']} ({v['overflow_mode']} overflow): "
                       f"{'passed' if v['passed'] else 'FAILED'}{tail}")
    return 0 if report["passed"] else EXIT_PARITY_FAILED


def _print_multi_validate(bundle: str, report: dict[str, Any], as_json: bool) -> int:
    from ..bundle.manifest import summarize_parity

    parts = {name: {"passed": r["passed"], "manifest_sha256": r["manifest_sha256"], "parity": summarize_parity(r),
                    **({"socs": r["socs"]} if "socs" in r else {})} for name, r in report["components"].items()}
    if as_json:
        click.echo(to_json({"ok": report["passed"], "bundle": bundle, "kind": report.get("kind"),
                            "manifest_sha256": report["manifest_sha256"], "components": parts}))
    else:
        click.echo(f"{bundle}: {len(parts)} graphs, parity {'passed' if report['passed'] else 'FAILED'} (re-derived; "
                   f"manifest sha256 {report['manifest_sha256']})")
        for name, part in parts.items():
            device = (part["parity"].get("device") or {}).get("passed")
            click.echo(f"  {name}: {'passed' if part['passed'] else 'FAILED'} (fp32 "
                       f"{'ok' if part['parity'].get('fp32', {}).get('passed') else 'FAIL'}, device "
                       f"{'ok' if device else 'FAIL' if device is False else 'n/a'})")
    return 0 if report["passed"] else EXIT_PARITY_FAILED


@cli.command("inspect")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True)
def inspect_cmd(path: str, as_json: bool) -> int:
    """Show what a bundle or an .onnx file holds."""

    from .. import api

    info = api.inspect(path)
    if as_json:
        click.echo(to_json(info))
        return 0
    if info.get("kind") == "multi-graph":
        return _print_multi_inspect(info)
    click.echo(f"{info['path']} ({info['kind']}, opset {info['opset']}, {info['nodes']} nodes, {info['producer']})")
    for title in ("inputs", "outputs"):
        click.echo(f"{title}:")
        for v in info[title]:
            click.echo(f"  {v['name']}: {v['dtype']}{v['shape']}")
    click.echo("ops: " + ", ".join(f"{k} x{v}" for k, v in info["ops"].items()))
    if info["metadata"]:
        click.echo("metadata:")
        for k, v in info["metadata"].items():
            click.echo(f"  {k} = {v}")
    if info.get("manifest_sha256"):
        click.echo(f"manifest sha256: {info['manifest_sha256']}")
    for note in info.get("notes") or []:  # what the artifact's Format says of it (its describe)
        click.echo(note)
    if info.get("parity"):
        p = info["parity"]
        click.echo(f"parity recorded at export (`cann-export validate` re-derives it): "
                   f"{'passed' if p.get('passed') else 'FAILED' if p.get('validated') else 'not validated'}"
                   + (f" (device precision {p['precision']['mode']})" if p.get("precision") else ""))
        if p.get("first_divergence"):
            click.echo(f"  {p['first_divergence']['message']}")
    return 0


def _print_multi_inspect(info: dict[str, Any]) -> int:
    click.echo(f"{info['path']} (multi-graph bundle: {info['bundle_kind']}, {len(info['components'])} graphs; "
               f"parity recorded {'passed' if info['parity'].get('passed') else 'FAILED'})")
    for name, comp in info["components"].items():
        click.echo(f"[{name}] role {comp['role']}, opset {comp['opset']}, {comp['nodes']} nodes")
        for title in ("inputs", "outputs"):
            click.echo(f"  {title}: " + ", ".join(f"{v['name']}{v['shape']}" for v in comp[title]))
    feeds = {}
    for c in info["connections"]:
        key = f"{c['from']['component']} -> {c['to']['component']}"
        feeds[key] = feeds.get(key, 0) + 1
    click.echo("connections: " + "; ".join(f"{k} ({n} tensors)" for k, n in feeds.items()))
    click.echo(f"manifest sha256: {info['manifest_sha256']}")
    return 0


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True)
def plugins_cmd(as_json: bool) -> int:
    """List the plugins with their versions and hooks."""

    from ..hooks.manager import describe_plugins

    rows = describe_plugins()
    if as_json:
        click.echo(to_json(rows))
    else:
        for row in rows:
            kind = "built-in" if row["builtin"] else "third-party"
            click.echo(f"{row['name']} {row['version']} ({kind}): {', '.join(row['hooks'])}")
    return 0


def _register_plugin_commands() -> None:
    from ..hooks.manager import registry

    registry().add_commands(cli)


def _start() -> None:
    from ..sandbox.child import note_process_start

    note_process_start()
    if not os.environ.get("CANN_EXPORT_DEBUG"):
        import warnings

        warnings.filterwarnings("ignore")  # library chatter (tracer, deprecations) is not for CLI users


def main() -> None:
    _start()
    try:
        _register_plugin_commands()
    except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not hide the CLI
        click.echo(f"warning: plugin commands not loaded: {e}", err=True)
    cli()


def export_main() -> None:
    """``cann.torch.export``: the articles' CI line (``cann.torch.export --model model.pth --format atc_ready``)
    as a command of its own, the same as ``cann-export export``."""
    _start()
    export_cmd.main(prog_name="cann.torch.export")
