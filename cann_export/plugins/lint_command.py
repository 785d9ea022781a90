"""``cann-export lint PATH``: the ATC lint (validators/atc_lint.lint_model) on an .onnx file, a bundle or an
om-stub, without exporting. Reading the artifact and printing live here; the lint itself is pure."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..atc.lint import lint_model, parse_cann_version
from ..graph import module_paths
from ..hooks.specs import hookimpl
from ..safe_text import terminal


def load_for_lint(path: Path, extra_hints: dict[str, Any]) -> tuple[Any, dict[str, Any], str]:
    """(graph, ATC hints, precision mode) of an .onnx file or an atc_ready bundle."""
    from ..errors import LintError

    if not path.exists():  # before onnx's import: a mistyped path costs no second
        raise LintError("path not found; pass an .onnx file or an atc_ready bundle directory", path=path)
    import onnx

    hints: dict[str, Any] = {}
    precision = "force_fp16"
    onnx_path = path
    if path.is_dir():
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise LintError("not an atc_ready bundle (no manifest.json); pass the bundle directory or an .onnx file",
                            path=path)
        from ..bundle.rederive import check_bundle
        from ..errors import ValidateError

        try:  # lint the graph and the ATC options the bundle really holds, re-derived, not read back
            checked = check_bundle(path, stage="lint")
        except ValidateError as e:
            raise LintError(e.message, path=e.path) from e
        if checked.options is not None:
            from ..atc.hints import effective_precision

            hints = dict(checked.options.atc_hints)
            precision = effective_precision(checked.options)
        onnx_path = path / checked.manifest["model"]["file"]
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError and friends
        raise LintError(f"not a readable ONNX model ({type(e).__name__}); pass an .onnx file or an atc_ready bundle",
                        path=onnx_path) from e
    if not path.is_dir():
        stored = {p.key: p.value for p in model.metadata_props}.get("cann_export.atc_hints")
        if stored:
            try:
                hints = dict(json.loads(stored))
            except (ValueError, TypeError):
                hints = {}
    hints.update(extra_hints)
    if path.is_dir() and checked.options is not None and checked.options.dynamic:
        from ..atc.dynamic_form import atc_form

        # the dynamic form convert.sh holds (rendered for the bundle's CANN release), linted as options
        form = atc_form(model, list(checked.options.dynamic), checked.options.cann_version, hints)
        hints = {**{k: v for k, v in form["options"].items() if k not in hints},
                 "input_shape": hints.get("input_shape") or form["input_shape"], **hints}
    return model, hints, hints.get("precision_mode") or precision


def lint_components(directory: Path, shown: Path, cann_version: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The lint of every graph of a multi-graph bundle (checked against its top-level manifest first), by name."""
    from ..bundle.rederive import BundleMismatchError
    from ..bundle.multi_check import check_multi

    manifest, diffs = check_multi(directory)
    if diffs:
        raise BundleMismatchError(diffs, path=shown, stage="lint")
    reports = {}
    for c in manifest["components"]:
        model, hints, precision = load_for_lint(directory / c["path"], extra)
        reports[c["name"]] = lint_model(model, cann_version, hints, precision, module_paths.collect(model))
    return reports


def _print_report(path: str, report: dict[str, Any]) -> None:
    import click

    errors_ = [f for f in report["findings"] if f["severity"] == "error"]
    warnings_ = [f for f in report["findings"] if f["severity"] == "warning"]
    for f in report["findings"]:
        click.echo(terminal(f"{f['severity']}: [{f['rule']}] {f['message']}"))
    verdict = "passed" if report["passed"] else "FAILED"
    click.echo(terminal(f"{path}: ATC lint {verdict} for CANN {report['cann_version']} (opset {report['opset']}; "
                        f"{len(errors_)} error(s), {len(warnings_)} warning(s); "
                        f"op table: CANN {report['table']['cann_version']})"))


@hookimpl
def register_commands(cli):
    import click

    from ..usage.examples import examples

    @cli.command("lint", epilog=examples("cann-export lint model.onnx --cann-version 7.0.RC1",
                                         "cann-export lint resnet_bundle --atc-hint precision_mode=force_fp16"))
    @click.argument("path", type=click.Path(path_type=str))
    @click.option("--cann-version", default="8.0", show_default=True, help="Target CANN release (8.0, 7.0.RC1, ...).")
    @click.option("--atc-hint", "atc_hints", multiple=True,
                  help="KEY=VALUE ATC option to lint with (added to the bundle's hints); repeatable.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
    def lint_cmd(path: str, cann_version: str, atc_hints: tuple[str, ...], as_json: bool) -> int:
        """Check an .onnx file or an atc_ready bundle against what ATC accepts (no CANN install needed)."""
        from ..errors import LintError
        from ..options import parse_key_values

        if parse_cann_version(cann_version) is None:
            raise LintError(f"--cann-version {cann_version!r} is not a version like 8.0 or 7.0.RC1", path=path)
        from ..bundle.read import open_artifact
        from ..bundle.multi_check import opened_multi
        from ..errors import ValidateError
        from ..fs.jsonio import dumps

        extra = parse_key_values(atc_hints, "--atc-hint")
        try:
            with opened_multi(Path(path)) as multi:
                if multi is not None:  # several graphs: each component linted with its own ATC options
                    reports = lint_components(multi, Path(path), cann_version, extra)
                    ok = all(r["passed"] for r in reports.values())
                    if as_json:
                        click.echo(dumps({"ok": ok, "path": path, "components": reports}))
                    for name, report in reports.items() if not as_json else ():
                        _print_report(f"{path} [{name}]", report)
                    return 0 if ok else 1
            with open_artifact(Path(path)) as artifact:  # a stub or single-file bundle is unpacked (bounded) first
                model, hints, precision = load_for_lint(artifact, extra)
        except ValidateError as e:
            raise LintError(e.message, path=e.path) from e
        report = lint_model(model, cann_version, hints, precision, module_paths.collect(model))
        if as_json:
            click.echo(dumps({"ok": report["passed"], "path": path, **report}))
        else:
            _print_report(path, report)
        return 0 if report["passed"] else 1
