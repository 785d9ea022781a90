"""``cann-export inspect``'s readable view of ``api.inspect``'s object (``--json`` prints the object itself):
the graph, the target, the ATC command and cfg files, lint, the recorded verdict per output / gear, notes."""
from __future__ import annotations

import shlex
from typing import Any

from ..safe_text import terminal
from .fix_view import component_fix_line, fix_rerun_line

TOOL_METADATA = ("onnxsim.", "cann_export.", "pkg.")  # what the tool stamps; --json shows it
TOP_OPS = 8


def render(info: dict[str, Any]) -> list[str]:
    if info.get("kind") == "multi-graph":
        return _multi(info)
    if info.get("kind") == "om":
        return _compiled_om(info)
    lines = [_title(info)]
    if info.get("manifest_sha256"):
        lines.append(f"  manifest sha256 {info['manifest_sha256']}")
    lines += _graph(info, "")
    lines += _target(info, "")
    lines += _parity(info.get("parity"), "", bundle=bool(info.get("manifest_sha256")))
    lines += _coverage(info.get("coverage"), "  ")
    lines += _lint(info.get("lint"), "")
    lines += _notes(info, "")
    return lines


def _compiled_om(info: dict[str, Any]) -> list[str]:
    """A compiled ATC model: the header fields, what ``atc --mode=1`` read, the notes."""
    header = info["om"]
    lines = [f"{info['path']} (compiled ATC offline model; {_size(info['size_bytes'])} on disk)", "",
             f"  om header ({header['layout']} layout): name {header['name']!r}, platform_version "
             f"{header['platform_version']!r}, {header['model_type']}, om_ir_version {header['om_ir_version']}"
             + (f", model_num {header['model_num']}" if "model_num" in header else "")]
    described = info.get("atc_json") or {}
    if described.get("error"):
        lines.append(f"  atc --mode=1: {described['error']}")
    for key, value in (described.get("attrs") or {}).items():
        lines.append(f"  {key}: {value}")
    return lines + _notes(info, "")


def _title(info: dict[str, Any]) -> str:
    kind = info["kind"]
    what = {"onnx": "plain ONNX file (no manifest: no recorded verdict)", "om-stub": "om-stub: the bundle inside a "
            "stand-in .om, not a compiled model"}.get(kind, f"{kind} bundle")
    if info.get("container") == "archive":
        what += ", single-file archive"
    files = f"{len(info['files'])} files, " if info.get("files") else ""
    size = f"; {files}{_size(info['size_bytes'])} on disk" if info.get("size_bytes") is not None else ""
    return f"{info['path']} ({what}{size})"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _values(values: list[dict[str, Any]], width: int) -> list[str]:
    return [f"{v['name']:<{width}}  {v['dtype']:<8} {v['shape']}" for v in values]


def _graph(info: dict[str, Any], pad: str) -> list[str]:
    meta = info.get("metadata") or {}
    exporter = meta.get("cann_export.exporter")
    lines = ["", f"{pad}graph: opset {info['opset']}, {info['nodes']} nodes"
             + (f", {exporter} exporter" if exporter else "") + f" ({info['producer']})"]
    width = max((len(v["name"]) for v in info["inputs"] + info["outputs"]), default=0)
    for title in ("inputs", "outputs"):
        rows = _values(info[title], width)
        lines.append(f"{pad}  {title + ':':<9}{rows[0] if rows else '(none)'}")
        lines += [f"{pad}  {'':<9}{row}" for row in rows[1:]]
    ops = sorted(info["ops"].items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} x{v}" for k, v in ops[:TOP_OPS])
    more = f", ... ({len(ops) - TOP_OPS} more op types)" if len(ops) > TOP_OPS else ""
    lines.append(f"{pad}  top ops: {shown}{more}")
    own = {k: v for k, v in meta.items() if not k.startswith(TOOL_METADATA)}
    if own:
        lines.append(f"{pad}  metadata: " + ", ".join(f"{k}={v}" for k, v in own.items()))
    if meta.get("cann_export.source"):
        lines.append(f"{pad}  exported by {meta.get('cann_export.tool', 'cann-export')} from "
                     f"{meta['cann_export.source']} ({meta.get('cann_export.created_utc', 'time unknown')})")
    return lines


def _target(info: dict[str, Any], pad: str) -> list[str]:
    atc = info.get("atc")
    if not atc:
        return []
    device = ((info.get("parity") or {}).get("precision") or {}).get("device_model") or {}
    overflow = f" ({device['overflow_mode']} overflow{'' if device.get('known', True) else ', assumed'})" \
        if device.get("overflow_mode") else ""
    lines = ["", f"{pad}target: {atc.get('soc_version')}{overflow}, precision mode {atc.get('precision_mode')}"]
    if atc.get("command"):
        lines.append(f"{pad}  ATC command (atc/convert.sh): " + " ".join(shlex.quote(str(a)) for a in atc["command"]))
    om = atc.get("om")
    if om:
        lines.append(f"{pad}  model.om: {om.get('kind')}" + (f" ({om['reason']})" if om.get("reason") else ""))
    for rel, text in (info.get("atc_cfg") or {}).items():
        entries = text.split()
        shown = ", ".join(entries[:6]) + (f", ... ({len(entries) - 6} more)" if len(entries) > 6 else "")
        lines.append(f"{pad}  {rel}: {len(entries)} entries: {shown}")
    return lines


def _num(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def _parity(p: dict[str, Any] | None, pad: str, bundle: bool) -> list[str]:
    if not bundle:
        return []
    if not p or not p.get("validated", "outputs" in p):
        return ["", f"{pad}parity: not validated at export"]
    verdict = "passed" if p.get("passed") else "FAILED"
    stored = p.get("stored") if isinstance(p.get("stored"), dict) and isinstance(p["stored"].get("input_sets"), list) \
        else None
    kept = (f"; the bundle stores {len(stored.get('input_sets') or [])} of them (--stored-parity-mib "
            f"{stored.get('cap_mib')!r}), which `cann-export validate` re-derives" if stored else
            "; `cann-export validate` re-derives it")
    lines = ["", f"{pad}parity recorded at export: {verdict} ({p.get('input_sets')} input sets against "
             f"{p.get('reference')}{kept})"]
    device = p.get("device") or {}
    drows = {o["name"]: o for o in device.get("outputs") or []}
    precision = p.get("precision") or {}
    mode = precision.get("mode", "")
    for o in (p.get("fp32") or {}).get("outputs") or p.get("outputs") or []:
        lines.append(f"{pad}  {o['name']}")
        lines.append(f"{pad}    {'fp32':<{8 + len(mode)}} {_row(o)}")
        if o["name"] in drows:
            lines.append(f"{pad}    {'device ' + mode:<{8 + len(mode)}} {_row(drows[o['name']])}")
    for s in p.get("shapes") or []:
        shape = ", ".join(f"{k}={v}" for k, v in (s.get("shape") or {}).items())
        dev = "" if "device" not in s else f", device {'ok' if s['device'] else 'FAIL'}"
        lines.append(f"{pad}  at {shape}: fp32 {'ok' if s.get('fp32') else 'FAIL'}{dev}")
    if p.get("probes"):
        lines.append(f"{pad}  specialisation probes ({p['probes'].get('input_sets')} sets): "
                     f"{'ok' if p['probes'].get('passed') else 'FAILED'}")
    if p.get("first_divergence"):
        lines.append(f"{pad}  {p['first_divergence']['message']}")
    if p.get("fixed_by_keep_dtype"):
        lines.append(f"{pad}  kept in fp32 by --fix-precision: {len(p['fixed_by_keep_dtype'])} ops")
    if p.get("reason"):
        lines.append(f"{pad}  reason: {p['reason']}")
    return lines


def _coverage(found: dict[str, Any] | None, pad: str) -> list[str]:
    """What parity covered of what ATC builds (bundle/coverage.py)."""
    from ..bundle import coverage

    if not found:
        return []
    more = coverage.hint(found)
    return [f"{pad}covers {coverage.sentence(found)}" + (f" [{more}]" if more else "")]


def _row(o: dict[str, Any]) -> str:
    reason = f"  ({o['reason']})" if o.get("reason") else ""
    return (f"{'ok  ' if o.get('passed') else 'FAIL'}  cosine {_num(o.get('cosine'), '.6f')}  max abs "
            f"{_num(o.get('max_abs'))}  max rel {_num(o.get('max_rel'))}{reason}")


def _lint(lint: dict[str, Any] | None, pad: str) -> list[str]:
    lines = []
    for name, report in (lint or {}).items():
        if not isinstance(report, dict):
            continue
        findings = report.get("findings") or []
        release = f" for CANN {report['cann_version']}" if report.get("cann_version") else ""
        lines.append(f"{pad}lint {name}{release}: {'passed' if report.get('passed') else 'FAILED'}, "
                     f"{len(findings)} finding(s)")
        lines += [f"{pad}  {f.get('severity')}: [{f.get('rule')}] {f.get('message')}" for f in findings[:10]]
        if len(findings) > 10:
            lines.append(f"{pad}  ... ({len(findings) - 10} more; --json shows all)")
    return [""] + lines if lines else []


def _notes(info: dict[str, Any], pad: str) -> list[str]:
    notes = list(info.get("notes") or [])  # what the artifact's Format says of it (an om-stub's header, say)
    spec = (info.get("parity") or {}).get("trace_specialized")
    if spec:
        accepted = (f"checked on {spec['checked'].get('input_sets')} input sets" if spec.get("checked")
                    else "accepted" if spec.get("accepted") else "not accepted")
        notes.append(f"traced graph, specialised to the example's path ({accepted}): "
                     f"{len(spec.get('warnings') or [])} tracer warning(s)")
    for kind, items in (info.get("warnings") or {}).items():  # strings, or lists of them
        notes += [f"warning ({kind}): {item}" for item in (items if isinstance(items, list) else [items])]
    if not notes:
        return []
    return ["", f"{pad}notes:"] + [f"{pad}  - {n}" for n in notes]


def _cache(pipeline: Any) -> list[str]:
    """A pipeline's denoiser cache (insert_teacache): its policy and what the export measured, one line a fact."""
    from ..diffusion.cache_facts import cache_rows

    rows = cache_rows(pipeline)
    if not rows:
        return []
    return ["", "denoiser cache (insert_teacache):"] + [f"  {label}: {terminal(text)}" for label, text in rows]


def _multi(info: dict[str, Any]) -> list[str]:
    p = info.get("parity") or {}
    size = f", {len(info['files'])} files, {_size(info['size_bytes'])} on disk" if "size_bytes" in info else ""
    lines = [f"{info['path']} ({info.get('format') or 'atc_ready'} multi-graph bundle: {info['bundle_kind']}, "
             f"{len(info['components'])} graphs{size}; "
             f"parity recorded at export {'passed' if p.get('passed') else 'FAILED'})",
             f"  manifest sha256 {info['manifest_sha256']}"]
    if info.get("atc_script"):
        lines.append(f"  ATC: {info['atc_script']} runs each graph's own command, shown below")
    for name, comp in info["components"].items():
        lines += ["", f"[{name}] role {comp.get('role')}"]
        sub = _graph(comp, "  ") + _target(comp, "  ") + _parity(comp.get("parity"), "  ", bundle=True)
        sub += _coverage(comp.get("coverage"), "    ")
        lines += [line for line in sub if line] + _lint(comp.get("lint"), "  ")[1:]
        if name in (info.get("precision_fix") or {}):
            lines.append(f"  {component_fix_line(info['precision_fix'][name])}")
    if line := fix_rerun_line((info.get("pipeline") or {}).get("end_to_end")):
        lines += ["", line]
    lines += _cache(info.get("pipeline"))
    feeds: dict[str, int] = {}
    for c in info["connections"]:
        key = f"{c['from']['component']} -> {c['to']['component']}"
        feeds[key] = feeds.get(key, 0) + 1
    lines += ["", "connections: " + "; ".join(f"{k} ({n} tensors)" for k, n in feeds.items())]
    return lines
