"""The lint and validate stages: the registered validators of each, with one verdict."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..context import ExportContext
from ..hooks import manager
from ..context import ParityReport, ValidatorReport


def run_validators(ctx: ExportContext, stage: str) -> str | None:
    """Run the validators of ``stage``. A failed lint raises (unless ``--lint warn``/``off``); a failed
    parity is recorded and reported through the result instead."""
    validators = [v for v in manager.registry().validators() if v.stage == stage and _applies(v, ctx.format)]
    if stage == "lint" and ctx.options.lint == "off":
        validators = []
    if not validators:
        return "skipped"
    failed = []
    for v in validators:
        report = v.check(ctx)
        if not _record(ctx, stage, v.name, report):
            failed.append(v.name)
    if failed and stage == "lint":
        findings = [f for name in failed for f in ctx.reports.lint[name].get("findings", [])
                    if f.get("severity") == "error"]
        if ctx.options.lint == "error":
            shown = "; ".join(f.get("message", "") for f in findings[:10])
            more = f" (+{len(findings) - 10} more)" if len(findings) > 10 else ""
            raise errors.LintError(f"{len(findings)} ATC lint error(s): {shown}{more}. Fix the model or the hints, "
                                   "or pass --lint warn to export anyway", path=_source(ctx))
        return f"{len(findings)} lint error(s) reported as warnings (--lint warn)"
    return f"FAILED: {', '.join(failed)}" if failed else "passed"


def _record(ctx: ExportContext, stage: str, name: str, report: ParityReport | ValidatorReport) -> bool:
    """File ``report`` in its typed place (the parity verdict, or the stage's reports by name); did it pass?"""
    if isinstance(report, ParityReport):
        ctx.reports.parity = report
        return report.passed
    (ctx.reports.lint if stage == "lint" else ctx.reports.validators)[name] = report
    return bool(report.get("passed", False))


def _applies(validator: Any, fmt: Any) -> bool:
    """A validator's ``formats``: "*", a tuple of format names, or a predicate on the Format object."""
    wanted = validator.formats
    return wanted == "*" or (wanted(fmt) if callable(wanted) else fmt.name in wanted)


def _source(ctx: ExportContext) -> str | None:
    return ctx.loaded.source_path if ctx.loaded else None
