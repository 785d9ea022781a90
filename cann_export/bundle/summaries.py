"""CI summaries of a verdict, from manifest dicts (``graphs``: ``{component name or None: manifest}``, one entry
for a single-graph bundle, one per component for a multi-graph one): a Markdown table for a job summary,
JUnit XML with one test case per output (x gear/shape, x component), and GitHub workflow-command
annotations pointing at the model's source line where the manifest knows it. Pure: the CLI writes them."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..safe_text import markdown_code, markdown_fence, markdown_text, workflow_data, workflow_property, xml_text

Graphs = dict[Any, dict[str, Any]]  # {component name or None: manifest (or {"parity": ..., "atc": ...})}


@dataclass
class Case:
    """One output of one graph at one shape (gear / range point): its fp32 and device verdicts."""

    graph: str | None
    output: str
    shape: dict[str, int] | None = None
    fp32: bool | None = None  # None: not judged (not validated, or no metrics at this shape)
    device: bool | None = None
    fp32_row: dict[str, Any] | None = None  # the metrics (cosine, max_abs, max_rel) where known
    device_row: dict[str, Any] | None = None
    device_label: str = ""  # "force_fp16 on Ascend310P3"
    problems: list[str] = field(default_factory=list)
    source: str | None = None  # "file.py:LINE" of the first divergence, where a device failure has one
    skip_reason: str = "not validated (--no-validate)"

    @property
    def skipped(self) -> bool:
        return self.fp32 is None and self.device is None and not self.problems

    @property
    def passed(self) -> bool:
        return not self.problems and self.fp32 is not False and self.device is not False

    @property
    def name(self) -> str:
        return self.output + (f" [{shape_text(self.shape)}]" if self.shape else "")


def shape_text(shape: dict[str, int] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (shape or {}).items())


def cases(graphs: Graphs) -> list[Case]:
    """Every test case of the verdict: per graph, per shape (the example's first), per output."""
    out: list[Case] = []
    for name, manifest in graphs.items():
        out += _graph_cases(name, manifest)
    return out


def _graph_cases(graph: str | None, manifest: dict[str, Any]) -> list[Case]:
    parity = manifest.get("parity") or {}
    fp32_rows = (parity.get("fp32") or {}).get("outputs") or parity.get("outputs") or []
    names = [o["name"] for o in fp32_rows] or [v["name"] for v in (manifest.get("model") or {}).get("outputs", [])]
    if not parity.get("validated", "outputs" in parity):  # --no-validate: nothing judged
        return [Case(graph, n) for n in names]
    device = parity.get("device")
    device_rows = {o["name"]: o for o in (device or {}).get("outputs") or []}
    label = _device_label(parity)
    first = parity.get("first_divergence") or {}
    shapes = parity.get("shapes") or [None]
    failing = [f for f in parity.get("failing_sets") or [] if f.get("role") != "probe"]
    result = []
    for i, shape in enumerate(shapes):
        for row in fp32_rows:
            case = Case(graph, row["name"], (shape or {}).get("shape"), device_label=label)
            if shape is not None and shape.get("rederived") is False:  # validate: its sets were not stored
                case.skip_reason = (f"not re-derived: the bundle did not store this shape's parity sets "
                                    f"(--stored-parity-mib); the export's verdict: "
                                    f"{'passed' if shape.get('passed') else 'FAILED'}")
                result.append(case)
                continue
            if shape is None:
                case.fp32 = bool(row.get("passed"))
            else:  # the verdicts at this shape (fp32 per output where a failing set says so)
                sets = set(shape.get("input_sets") or [])
                mine = [f for f in failing if f.get("output") == row["name"] and f.get("set") in sets]
                case.fp32 = not mine if failing else bool(shape.get("fp32"))
                if "device" in shape:
                    case.device = bool(shape["device"])
            if i == 0:  # the example's shape: the per-output metrics (fp32's over every shape's sets)
                case.fp32_row = row
                if device is not None:
                    drow = device_rows.get(row["name"])
                    own = bool(drow["passed"]) if drow else bool(device.get("passed"))
                    case.device = own if case.device is None else case.device and own
                    case.device_row = drow
            if case.fp32 is False:
                case.problems.append(_fp32_problem(case, row, parity))
            if case.device is False:
                case.problems.append(_device_problem(case, first))
                case.source = first.get("source")
            result.append(case)
    for soc in manifest.get("socs") or []:  # validate --soc-version: one device verdict per SoC
        where = soc.get("first_divergence") or {}
        case = Case(graph, f"device precision on {soc['soc_version']}", device=bool(soc.get("passed")),
                    device_label=f"{(parity.get('precision') or {}).get('mode', '')} on {soc['soc_version']} "
                                 f"({soc.get('overflow_mode')} overflow)")
        if not case.device:
            case.problems.append(f"device precision ({case.device_label}) failed"
                                 + (f"; {where['message']}" if where.get("message") else ""))
            case.source = where.get("source")
        result.append(case)
    if not parity.get("passed") and all(c.passed for c in result):  # failed for a reason no output shows
        reason = parity.get("reason") or ("specialisation probes failed" if not (parity.get("probes") or {})
                                          .get("passed", True) else "parity failed")
        result.append(Case(graph, "(graph verdict)", problems=[reason]))
    return result


def _device_label(parity: dict[str, Any]) -> str:
    precision = parity.get("precision") or {}
    soc = (precision.get("device_model") or {}).get("soc_version")
    return (precision.get("mode") or "") + (f" on {soc}" if soc else "")


def _fp32_problem(case: Case, row: dict[str, Any], parity: dict[str, Any]) -> str:
    where = f" at {shape_text(case.shape)}" if case.shape else ""
    metrics = f" (cosine {_num(row.get('cosine'), '.6f')}, max abs {_num(row.get('max_abs'))})" if case.fp32_row else ""
    reason = f": {row['reason']}" if row.get("reason") else ""
    return f"fp32 parity failed for {case.output}{where}{metrics}{reason}"


def _device_problem(case: Case, first: dict[str, Any]) -> str:
    where = f" at {shape_text(case.shape)}" if case.shape else ""
    row = case.device_row or {}
    metrics = f" (cosine {_num(row.get('cosine'), '.6f')}, max abs {_num(row.get('max_abs'))})" if row else \
        " (the verdict at this shape covers the whole graph)"
    reason = f": {row['reason']}" if row.get("reason") else ""
    div = f"; {first['message']}" if first.get("message") else ""
    return f"device precision ({case.device_label}) failed for {case.output}{where}{metrics}{reason}{div}"


def _num(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def atc_command(manifest: dict[str, Any]) -> str | None:
    import shlex

    command = (manifest.get("atc") or {}).get("command")
    return " ".join(shlex.quote(str(a)) for a in command) if command else None


def passed(graphs: Graphs) -> bool:
    return all((m.get("parity") or {}).get("passed", False) for m in graphs.values())


# ------------------------------------------------------------------------------------------------ Markdown


def _mark(value: bool | None) -> str:
    return "—" if value is None else "✅ passed" if value else "❌ FAILED"


def markdown(command: str, path: str, graphs: Graphs) -> str:
    """A job-summary section: the overall verdict, one table row per case, the first divergence, lint
    findings and each graph's ATC command."""
    found = cases(graphs)
    multi = any(name is not None for name in graphs)
    shaped = any(c.shape for c in found)
    ok = passed(graphs) and all(c.passed for c in found)
    validated = any(not c.skipped for c in found)
    verdict = "✅ passed" if ok else "❌ FAILED" if validated else "⚪ not validated"
    lines = [f"### cann-export {command}: {verdict} — {markdown_code(path)}", ""]
    head = (["graph"] if multi else []) + ["output"] + (["shape"] if shaped else []) + \
        ["fp32 parity", "device precision", "cosine (fp32 / device)", "max abs err (fp32 / device)",
         "max rel err (fp32 / device)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in found:
        f, d = c.fp32_row or {}, c.device_row or {}
        label = markdown_text(f" ({c.device_label})") if c.device is not None and c.device_label else ""
        names = [markdown_code(n, in_table=True) for n in ([c.graph] if multi else []) + [c.output]]
        cells = names + ([markdown_text(shape_text(c.shape))] if shaped else []) + [
            _mark(c.fp32), _mark(c.device) + label,
            f"{_num(f.get('cosine'), '.6f')} / {_num(d.get('cosine'), '.6f')}" if f or d else "—",
            f"{_num(f.get('max_abs'))} / {_num(d.get('max_abs'))}" if f or d else "—",
            f"{_num(f.get('max_rel'))} / {_num(d.get('max_rel'))}" if f or d else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    for name, manifest in graphs.items():
        prefix = f"{markdown_code(name)}: " if multi else ""
        parity = manifest.get("parity") or {}
        if (parity.get("first_divergence") or {}).get("message"):
            lines += ["", f"{prefix}**{markdown_text(parity['first_divergence']['message'])}**"]
        for problem in [c.problems[0] for c in found if c.graph == name and c.output == "(graph verdict)"]:
            lines += ["", f"{prefix}**{markdown_text(problem)}**"]
        findings = [f for report in (manifest.get("lint") or {}).values() if isinstance(report, dict)
                    for f in report.get("findings") or []]
        if findings:
            lines += ["", f"{prefix}ATC lint: {len(findings)} finding(s)", ""]
            lines += [markdown_text(f"- {f.get('severity')}: [{f.get('rule')}] {f.get('message')}")
                      for f in findings[:10]]
        command = atc_command(manifest)
        if command:
            lines += ["", f"{prefix}ATC command (`atc/convert.sh`):", "", *markdown_fence(command, "bash")]
    return "\n".join(lines) + "\n"


def refused_markdown(command: str, path: str, error: dict[str, Any]) -> str:
    reason = markdown_text(f"[{error.get('stage') or 'error'}] {error.get('message', '')}")
    return f"### cann-export {command}: ❌ refused — {markdown_code(path)}\n\n{reason}\n\nNo verdict was reached.\n"


# ------------------------------------------------------------------------------------------------ JUnit


def junit(command: str, path: str, graphs: Graphs, seconds: float = 0.0, workspace: str | None = None) -> str:
    """JUnit XML (testsuites > testsuite > testcase, with <failure> or <skipped/>): what Jenkins, GitLab and
    GitHub test reporters read. One test case per output x shape x graph; a failing one carries the source
    ``file`` (relative to ``workspace`` when inside it) and ``line`` where the first divergence knows them."""
    found = cases(graphs)
    suite_name = f"cann-export {command} {os.path.basename(path.rstrip('/')) or path}"
    props = {f"atc_command{'.' + name if name else ''}": atc_command(m) for name, m in graphs.items()}
    return _xml(suite_name, path, found, seconds, {k: v for k, v in props.items() if v}, workspace=workspace)


def refused_junit(command: str, path: str, error: dict[str, Any]) -> str:
    """A refused run: one failing test case naming the stage and the error (CI shows why, not a blank)."""
    case = Case(None, command, problems=[f"[{error.get('stage') or 'error'}] {error.get('message', '')}"])
    return _xml(f"cann-export {command} {os.path.basename(path.rstrip('/')) or path}", path, [case], 0.0, {},
                failure_type=f"refused:{error.get('stage') or 'error'}")


def _xml(suite_name: str, path: str, found: list[Case], seconds: float, props: dict[str, str],
         failure_type: str = "", workspace: str | None = None) -> str:
    import xml.etree.ElementTree as ET

    failures = sum(not c.passed for c in found)
    skipped = sum(c.skipped for c in found)
    counts = {"tests": str(len(found)), "failures": str(failures), "errors": "0", "skipped": str(skipped),
              "time": f"{seconds:.3f}"}
    root = ET.Element("testsuites", {"name": "cann-export", **counts})
    suite = _element(root, "testsuite", {"name": suite_name, **counts})
    if props:
        properties = ET.SubElement(suite, "properties")
        for key, value in props.items():
            _element(properties, "property", {"name": key, "value": value})
    base = "cann-export." + (os.path.basename(path.rstrip("/")) or "artifact").replace(".", "_")
    for c in found:
        attrs = {"classname": base + (f".{c.graph}" if c.graph else ""), "name": c.name, "time": "0"}
        case = _element(suite, "testcase", {**attrs, **_location(c.source, workspace)})  # GitLab reads file
        if c.problems:
            kind = failure_type or ("device_precision" if c.device is False else "fp32_parity" if c.fp32 is False
                                    else "verdict")
            _element(case, "failure", {"message": c.problems[0], "type": kind}, "\n".join(c.problems))
        elif c.skipped:
            _element(case, "skipped", {"message": c.skip_reason})
        metrics = _metrics_text(c)
        if metrics:
            _element(case, "system-out", {}, metrics)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _element(parent: Any, tag: str, attrs: dict[str, str], text: str | None = None) -> Any:
    """A child element whose attribute values and text hold only what XML 1.0 allows (xml_text)."""
    import xml.etree.ElementTree as ET

    element = ET.SubElement(parent, tag, {key: xml_text(value) for key, value in attrs.items()})
    if text is not None:
        element.text = xml_text(text)
    return element


def _metrics_text(c: Case) -> str:
    lines = []
    for title, row in (("fp32", c.fp32_row), (f"device ({c.device_label})", c.device_row)):
        if row:
            lines.append(f"{title}: cosine={_num(row.get('cosine'), '.6f')} max_abs={_num(row.get('max_abs'))} "
                         f"max_rel={_num(row.get('max_rel'))} passed={row.get('passed')}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ annotations


def _location(source: str | None, workspace: str | None) -> dict[str, str]:
    """``file`` and ``line`` of ``"path/to/file.py:LINE"`` (relative to the workspace when inside it)."""
    m = re.fullmatch(r"(.+):(\d+)", source or "")
    if not m:
        return {}
    file = m[1]
    if workspace and os.path.isabs(file):
        rel = os.path.relpath(file, workspace)
        file = file if rel.startswith("..") else rel
    return {"file": file, "line": m[2]}


def annotation(level: str, message: str, title: str, source: str | None = None, workspace: str | None = None) -> str:
    props = {**_location(source, workspace), "title": title}
    return f"::{level} " + ",".join(f"{k}={workflow_property(v)}" for k, v in props.items()) + \
        f"::{workflow_data(message)}"


def annotations(command: str, graphs: Graphs, workspace: str | None = None) -> list[str]:
    """``::error`` per failing case (at the first divergence's source line where known) and per ATC lint error
    (at the node's source line where known)."""
    out = []
    for c in cases(graphs):
        if c.problems:
            title = f"cann-export {command}: " + (f"{c.graph}/" if c.graph else "") + c.name
            out.append(annotation("error", "; ".join(c.problems), title, c.source, workspace))
    for name, manifest in graphs.items():
        for report in (manifest.get("lint") or {}).values():
            for f in (report.get("findings") if isinstance(report, dict) else None) or []:
                if f.get("severity") == "error":  # warnings stay in the summary: an annotation is for failures
                    title = f"ATC lint [{f.get('rule')}]" + (f" in {name}" if name else "")
                    out.append(annotation("error", f.get("message", ""), title, f.get("source"), workspace))
    return out


def refused_annotation(command: str, error: dict[str, Any]) -> str:
    return annotation("error", error.get("message", ""), f"cann-export {command} refused ({error.get('stage')})")
