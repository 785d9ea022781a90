"""report.html from a report view (report/view.py): one file, no fetches (a Content-Security-Policy that
forbids any), the data embedded as JSON (``#report-data``) so a test or a script can read what the page shows."""
from __future__ import annotations

import json
import math
from html import escape
from typing import Any

from ..fs.jsonio import sanitize
from . import plot

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1100px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #dde}
.badge{display:inline-block;padding:4px 12px;border-radius:4px;font-weight:600;color:#fff}
.pass{background:#1f8a4c}.fail{background:#c62828}.none{background:#777}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #dde;padding:3px 8px;text-align:left;
font-variant-numeric:tabular-nums}th{background:#f4f5f9}td.bad{color:#c62828;font-weight:600}
code,pre{font:12px/1.4 ui-monospace,monospace;background:#f4f5f9}pre{padding:8px;overflow-x:auto;white-space:pre-wrap}
svg .panel{fill:#fbfbfd;stroke:#ccd}svg .grid{stroke:#e6e6ee}svg .tick,svg .label{font-size:11px;fill:#556}
svg .trace{fill:none;stroke:#8aa2c8;stroke-width:1}svg .pt{fill:#2962ff;cursor:pointer}
svg .pt.fail{fill:#c62828}svg .pt.kept{fill:#fff;stroke:#ef6c00;stroke-width:2}
svg .first{stroke:#c62828;stroke-dasharray:4 3;stroke-width:1.5}svg .gap{font-size:10px;fill:#ef6c00;cursor:pointer}
.nonfinite{color:#ef6c00;font-weight:600}.images{display:flex;gap:16px}figure{margin:0;text-align:center}
figure img{image-rendering:pixelated;border:1px solid #dde}figcaption{font-size:12px;color:#556}
section.component{border-top:3px solid #dde;margin-top:32px}
#tip{position:fixed;display:none;background:#1d2330;color:#fff;padding:6px 9px;border-radius:4px;font-size:12px;
pointer-events:none;max-width:460px;white-space:pre-line}
"""

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var views = data.components || [data];
  var tip = document.getElementById('tip');
  function fmt(p, k) {
    var v = p[k];
    if (typeof v === 'number') { return v.toPrecision(6); }
    return ((p.non_finite && p.non_finite[k]) || 'n/a') + ' (not a finite number)';
  }
  document.querySelectorAll('svg.curve').forEach(function (svg) {
    var view = views[Number(svg.getAttribute('data-view'))] || {};
    var points = (view.layers && view.layers.points) || [];
    svg.querySelectorAll('.pt').forEach(function (el) {
      el.addEventListener('mouseenter', function (ev) {
        var p = points[Number(el.getAttribute('data-i'))];
        if (!p) { return; }
        tip.textContent = 'node ' + p.node + ' (' + p.op_type + ')\\nmodule ' + (p.module || 'unknown') +
          (p.source ? '\\nsource ' + p.source : '') + '\\ncosine ' + fmt(p, 'cosine') + '  max rel ' +
          fmt(p, 'max_rel') + (p.kept ? '\\nkept in fp32 (keep_dtype)' : '') +
          (p.passed ? '' : '\\nFAILS the device rule');
        tip.style.display = 'block';
        tip.style.left = (ev.clientX + 14) + 'px';
        tip.style.top = (ev.clientY + 14) + 'px';
      });
      el.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    });
  });
})();
"""


def render(view: dict[str, Any]) -> str:
    """The page of one graph (a single-graph bundle, or one component of a multi-graph bundle)."""
    name = f"{view.get('model_name') or view['title']}" + (f" / {view['component']}" if view.get("component") else "")
    return _page(name, "\n".join([_heading(view), *_sections(view, "curve", 0)]), view)


def render_multi(model: str, fmt: Any, views: list[dict[str, Any]], pipeline: dict[str, Any] | None = None) -> str:
    """One page for a multi-graph bundle: a section per component (each naming the model and the component),
    in the bundle's order; the embedded JSON is ``{"model_name", "format", "components": [view, ...]}``.
    ``pipeline``: a pipeline bundle's end-to-end section (report/pipeline_view.py), shown first."""
    from . import pipeline_view

    index = "".join(f'<li><a href="#component-{escape(v["component"])}">{escape(v["component"])}</a> '
                    f'{_badge(v["verdict"]["passed"]) if v["verdict"]["validated"] else ""}</li>' for v in views)
    parts = [f"<h1>{escape(model)} <small>({escape(str(fmt))}, {len(views)} components)</small></h1>",
             f'<ul id="components">{index}</ul>']
    if pipeline is not None:
        parts.append(pipeline_view.render(pipeline, _badge, _num))
    for k, v in enumerate(views):
        parts.append(f'<section class="component" id="component-{escape(v["component"])}">{_heading(v)}')
        parts += _sections(v, f"curve-{k}", k)
        parts.append("</section>")
    data = {"model_name": model, "format": fmt, "components": views}
    if pipeline is not None:  # the numbers, not the images (they are in the page once)
        data["pipeline"] = {k: v for k, v in pipeline.items() if k != "images"}
    return _page(model, "\n".join(parts), data)


def _heading(view: dict[str, Any]) -> str:
    model = view.get("model_name") or view["title"]
    component = f" &middot; component <code>{escape(view['component'])}</code>" if view.get("component") else ""
    return f"<h1>{escape(str(model))}{component} <small>({escape(str(view.get('format')))})</small></h1>"


def _sections(view: dict[str, Any], curve_id: str, index: int) -> list[str]:
    body = [_verdict(view), _outputs(view), _shapes(view), _curve(view, curve_id, index), _lint(view), _atc(view),
            _capture(view), _warnings(view)]
    return [b for b in body if b]


def _page(name: str, body: str, data: dict[str, Any]) -> str:
    blob = json.dumps(sanitize(data), allow_nan=False, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<title>{escape(name)}: cann-export report</title><style>{STYLE}</style></head><body>\n{body}"
            f"\n<div id=\"tip\"></div>\n<script type=\"application/json\" id=\"report-data\">{blob}</script>\n"
            f"<script>{SCRIPT}</script>\n</body></html>\n")


def _badge(ok: bool | None, yes: str = "PASS", no: str = "FAIL") -> str:
    if ok is None:
        return '<span class="badge none">not run</span>'
    return f'<span class="badge {"pass" if ok else "fail"}">{yes if ok else no}</span>'


def _verdict(view: dict[str, Any]) -> str:
    v = view["verdict"]
    if not v["validated"]:
        return '<p id="verdict"><span class="badge none">NOT VALIDATED</span> exported with --no-validate</p>'
    p = view["precision"]
    soc = (p.get("device_model") or {}).get("soc_version")
    lines = [f'<p id="verdict">verdict {_badge(v["passed"])} fp32 graph {_badge(v["fp32"])} device precision '
             f'{_badge(v["device"])}</p>']
    if p.get("mode"):
        lines.append(f"<p>precision mode <code>{escape(str(p['mode']))}</code>"
                     + (f" on <code>{escape(str(soc))}</code>" if soc else "")
                     + (f", keep_dtype: <code>{escape(', '.join(map(str, p['keep_dtype'])))}</code>"
                        if p["keep_dtype"] else "") + "</p>")
    first = view.get("first_divergence")
    if first:
        lines.append(f'<p id="first">{escape(str(first.get("message")))}</p>')
    if v.get("reason"):
        lines.append(f"<p>{escape(str(v['reason']))}</p>")
    return "\n".join(lines)


def _num(x: Any) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return f'<span class="nonfinite">{x}</span>'  # nan, inf, -inf: a label, never a number
    return f"{x:.4g}" if isinstance(x, float) else escape(str(x)) if x is not None else ""


def _outputs(view: dict[str, Any]) -> str:
    rows = []
    for o in view["outputs"]:
        cells = [f"<td>{escape(o['name'])}</td>"]
        for side in ("fp32", "device"):
            m = o.get(side) or {}
            bad = ' class="bad"' if m and not m.get("passed") else ""
            cells += [f"<td{bad}>{'ok' if m.get('passed') else 'FAIL' if m else ''}</td>",
                      f"<td>{_num(m.get('cosine'))}</td>", f"<td>{_num(m.get('max_abs'))}</td>",
                      f"<td>{_num(m.get('max_rel'))}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = ("<tr><th rowspan=2>output</th><th colspan=4>fp32 graph (onnxruntime)</th><th colspan=4>device "
            "(emulated)</th></tr><tr>" + "<th>verdict</th><th>cosine</th><th>max abs</th><th>max rel</th>" * 2
            + "</tr>")
    return f'<h2>Outputs</h2><table id="outputs">{head}{"".join(rows)}</table>'


def _shapes(view: dict[str, Any]) -> str:
    if not view["shapes"]:
        return ""
    rows = "".join(f"<tr><td><code>{escape(shape_text(r['shape']))}</code></td><td>{_flag(r['fp32'])}</td>"
                   f"<td>{_flag(r['device'])}</td><td>{'stored' if r.get('stored', True) else _NOT_STORED}</td></tr>"
                   for r in view["shapes"])
    return f'<h2>Per shape (gears, range points)</h2><table id="shapes"><tr><th>shape</th><th>fp32</th>' \
           f'<th>device</th><th>input sets in the bundle</th></tr>{rows}</table>'


_NOT_STORED = ("<i>not stored</i> (past <code>--stored-parity-mib</code>): the export's verdict, which "
               "<code>validate</code> and <code>cann-export report</code> do not re-derive")


def _flag(ok: Any) -> str:
    return "" if ok is None else "ok" if ok else '<b style="color:#c62828">FAIL</b>'


def shape_text(shape: Any) -> str:
    """``[1, 3, 224, 224]`` for one input's dims, ``input_ids [1, 128], attention_mask [1, 128]`` for several."""
    if isinstance(shape, dict):
        return ", ".join(f"{k} {shape_text(v)}" for k, v in shape.items())
    if isinstance(shape, (list, tuple)):
        return "[" + ", ".join(str(d) for d in shape) + "]"
    return str(shape)


def _curve(view: dict[str, Any], ident: str = "curve", index: int = 0) -> str:
    layers = view.get("layers")
    if not layers or not layers.get("points"):
        return "<h2>Per-layer precision</h2><p>No per-layer curve: the precision mode computes in fp32, or the " \
               "export ran no device emulation.</p>"
    first = (view.get("first_divergence") or {}).get("tensor")
    note = (f"{len(layers['points'])} values of {layers['values']} (cut at the plot's limit)"
            if layers.get("truncated") else f"{len(layers['points'])} values")
    sample = layers.get("sample") or {}
    where = f"input set {layers['input_set']}" + (f" (its sample {sample['index']} of {sample['of']})" if sample
                                                   else "")
    return (f"<h2>Per-layer precision</h2><p>Every float value the graph makes, in graph order, as the device "
            f"computes it ({escape(str(layers['mode']))}) against fp32, on {escape(where)}: {note}. "
            "Red: fails the device rule; hollow: kept in fp32 (keep_dtype); dashed line: the first divergence. "
            "Hover a point for its node and module.</p>" + plot.svg(layers, first, ident, index))


def _lint(view: dict[str, Any]) -> str:
    if not view["lint"]:
        return "<h2>Lint</h2><p>No findings.</p>"
    rows = "".join(
        f"<tr><td>{escape(str(f['severity']))}</td><td>{escape(str(f['rule']))}</td>"
        f"<td><code>{escape(str(f['module'] or ''))}</code></td><td><code>{escape(str(f['source'] or ''))}</code></td>"
        f"<td>{escape(str(f['message']))}</td></tr>" for f in view["lint"])
    return (f'<h2>Lint</h2><table id="lint"><tr><th>severity</th><th>rule</th><th>PyTorch module</th><th>source</th>'
            f"<th>finding</th></tr>{rows}</table>")


def _atc(view: dict[str, Any]) -> str:
    if not view.get("atc_command"):
        return ""
    return f'<h2>ATC command</h2><pre id="atc">{escape(view["atc_command"])}</pre>'


def _capture(view: dict[str, Any]) -> str:
    if not view["capture"]:
        return ""
    rows = "".join(f"<tr><td>{escape(str(a.get('exporter')))}</td><td>{escape(str(a.get('opset', '')))}</td>"
                   f"<td>{escape(str(a.get('error') or 'ok'))}</td></tr>" for a in view["capture"])
    return f'<h2>Capture attempts</h2><table id="capture"><tr><th>exporter</th><th>opset</th><th>result</th></tr>' \
           f"{rows}</table>"


def _warnings(view: dict[str, Any]) -> str:
    items = [f"<li><b>{escape(str(k))}</b>: {_warning(v)}</li>" for k, v in sorted(view["warnings"].items())]
    return f'<h2>Warnings</h2><ul id="warnings">{"".join(items)}</ul>' if items else ""


def _warning(value: Any) -> str:
    """A warning's text; a list of them as a list; numbers (non-finite ones labelled) as text."""
    if isinstance(value, (list, tuple)):
        return "<ul>" + "".join(f"<li>{_warning(v)}</li>" for v in value) + "</ul>"
    if isinstance(value, dict):
        return "<ul>" + "".join(f"<li><b>{escape(str(k))}</b>: {_warning(v)}</li>" for k, v in value.items()) + "</ul>"
    if isinstance(value, float):
        return _num(value)
    return escape(str(value))
