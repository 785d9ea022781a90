"""The ATC lint a bundle's manifest records, re-derived: the lint runs again on the bundle's graph with the ATC
options ``rederive`` validated and the CANN release the record names, and every finding the record adds, lacks
or judges otherwise is a difference, as is a record made with another op table than this release packages. A bundle
exported with ``--lint off`` records no lint and claims nothing; one whose graph keeps its weights in an external
data file has its lint left as recorded (the quantized checks read weights validate does not load)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from ..hooks.contracts import CheckedBundle
from .dynamic_check import short

OURS = "atc-lint"  # validators/atc_lint's name: other lint validators are plugins' records, not re-derived here
# an earlier release's lint warned on int64 token ids (atc/lint.index_like): recorded, it claims nothing
EARLIER_INT_NOTE = ("warning", "input-dtype", "None", "None")


def lint_differences(checked: CheckedBundle) -> list[str]:
    """What the manifest's ``lint.atc-lint`` says against the lint re-run on the graph (no record: nothing)."""
    recorded = (checked.manifest.get("lint") or {}).get(OURS)
    if recorded is None or checked.model is None or checked.options is None:
        return []
    where = f"lint.{OURS}"
    if not isinstance(recorded, dict):
        return [f"{where}: not an object"]
    version = recorded.get("cann_version")
    problem = _version_problem(version, checked)
    if problem:
        return [f"{where}.cann_version: {problem}"]
    table = _table()
    if recorded.get("table") != table:  # another release's table judges other ops: not re-derivable here
        return [f"{where}.table: the lint was recorded with op table {short(recorded.get('table'))}, this release "
                f"packages {short(table)}; validate with the release that wrote the bundle, or export it again"]
    from onnx.external_data_helper import uses_external_data

    if any(uses_external_data(t) for t in checked.model.graph.initializer):
        return []  # the quantized checks read zero points, which validate does not load from external data
    rerun = _rerun(checked, str(version))
    diffs = []
    if recorded.get("passed") is not rerun["passed"]:
        diffs.append(f"{where}.passed: the manifest says {short(recorded.get('passed'))}, the lint re-run on the "
                     f"graph {'passes' if rerun['passed'] else 'fails'}")
    stored = recorded.get("findings")
    if not isinstance(stored, list) or not all(isinstance(f, dict) for f in stored):
        return [*diffs, f"{where}.findings: not a list of findings"]
    extra = Counter(map(_key, stored)) - Counter(map(_key, rerun["findings"]))
    extra.pop(EARLIER_INT_NOTE, None)
    missing = Counter(map(_key, rerun["findings"])) - Counter(map(_key, stored))
    if extra:
        diffs.append(f"{where}.findings: the manifest records {short(_shown(extra))}, which the lint re-run on the "
                     "graph does not find")
    if missing:
        diffs.append(f"{where}.findings: the manifest lacks {short(_shown(missing))}, which the lint re-run on the "
                     "graph finds")
    return diffs


def _version_problem(version: Any, checked: CheckedBundle) -> str | None:
    from ..options import _is_version

    if not isinstance(version, str) or not _is_version(version):
        return f"{short(version)} is not a CANN release like 8.0"
    dynamic = checked.options.dynamic and checked.options.cann_version
    if dynamic and dynamic != version:
        return f"{version!r}, but atc.dynamic was rendered for CANN {dynamic!r}"
    return None


def _table() -> dict[str, Any]:
    from ..atc.lint import load_table

    table = load_table()
    return {"source": table["source"], "cann_version": table["cann_version"]}


def _rerun(checked: CheckedBundle, version: str) -> dict[str, Any]:
    from ..atc.hints import effective_precision
    from ..atc.lint import lint_model

    opts = checked.options
    return lint_model(checked.model, version, dict(opts.atc_hints), effective_precision(opts),
                      checked.module_paths, list(opts.dynamic or []))


def _key(finding: dict[str, Any]) -> tuple[str, ...]:
    """A finding by what it judges (severity, rule, node, op); the message's wording is not compared."""
    return tuple(str(finding.get(k)) for k in ("severity", "rule", "node", "op_type"))


def _shown(keys: Counter) -> list[str]:
    return [f"{sev} {rule} at {node if node != 'None' else op}" for sev, rule, node, op in sorted(keys.elements())]
