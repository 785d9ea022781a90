"""What --fix-lint changed in the graph (``lint.<linter>.fixes`` of the manifest) and what it left, one line each,
escaped for the terminal."""
from __future__ import annotations

from typing import Any

import click

from ..safe_text import terminal


def print_lint_fixes(manifest: dict[str, Any]) -> None:
    for report in (manifest.get("lint") or {}).values():
        if not isinstance(report, dict):
            continue
        for fix in report.get("fixes") or []:
            where = f"module {fix['module']}, " if fix.get("module") else ""
            click.echo(terminal(f"--fix-lint: {fix['rule']} at {where}node {fix['node']!r}: {_change(fix)}"))
        for left in report.get("not_fixed") or []:
            click.echo(terminal(f"--fix-lint left {left['rule']} at node {left['node']!r}: {left['reason']}"))
        if report.get("fix_lint"):
            click.echo(terminal(f"--fix-lint {report['fix_lint']}"))


def _change(fix: dict[str, Any]) -> str:
    before, after = fix.get("before") or {}, fix.get("after") or {}
    change = f"{before.get('op')} -> {after.get('op')}"
    if after.get("removed"):
        change += f" (inputs {before.get('inputs')} -> {after.get('inputs')}; removed {', '.join(after['removed'])})"
    elif after.get("pad_input_shape"):
        change += f" (padded at shape {after['pad_input_shape']} instead of {before.get('input_shape')})"
    elif before.get("kernel_shape"):
        change += f" (kernel {before['kernel_shape']} over input {before.get('input_shape')})"
    return change
