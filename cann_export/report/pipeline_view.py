"""The pipeline section of a pipeline bundle's report.html: the end-to-end check's verdicts and numbers (fp32
latents against diffusers, the device image's cosine distance and PSNR), the NaN / Inf each component gave, and
its three images side by side (diffusers eager, the exported components in onnxruntime fp32 and under the device
emulation) as PNG data URIs read from the bundle's own files (listed and hashed in its file table, checked before
this runs; bounded, PNG only); and the denoiser's cache, where insert_teacache asked one: its policy and what the
export measured (diffusion/cache_facts.py)."""
from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

MAX_IMAGE = 2 << 20  # the export writes at most 256 px a side: a few KB
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CAPTIONS = {"eager": "diffusers (eager)", "fp32": "exported, onnxruntime fp32", "device": "exported, device emulation"}


def build(directory: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The section's data (None when the bundle is not a pipeline's, or was exported with --no-validate and records
    no cache)."""
    from ..diffusion.cache_facts import cache_passed, cache_rows

    section = manifest.get("pipeline")
    e2e = section.get("end_to_end") if isinstance(section, dict) else None
    cache = {"rows": cache_rows(section), "passed": cache_passed(section)}
    if not isinstance(e2e, dict):
        return {"class": section.get("class"), "cache": cache} if cache["rows"] else None
    images = e2e.get("images") if isinstance(e2e.get("images"), dict) else {}
    uris = {}
    for key in CAPTIONS:
        rel = images.get(key)
        if isinstance(rel, str) and rel in manifest["files"]:
            data = _png(directory / rel)
            if data is not None:
                uris[key] = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return {"class": section.get("class"), "end_to_end": {k: v for k, v in e2e.items() if k != "images"},
            "images": uris, **({"cache": cache} if cache["rows"] else {})}


def _png(path: Path) -> bytes | None:
    with open(path, "rb") as f:
        data = f.read(MAX_IMAGE + 1)
    return data if len(data) <= MAX_IMAGE and data.startswith(PNG_MAGIC) else None


def render(view: dict[str, Any], badge: Any, num: Any) -> str:
    """The sections' HTML (the end-to-end check, the cache); ``badge`` and ``num`` are the page's own verdict badge
    and number formatting."""
    cache = _cache(view["cache"], badge) if "cache" in view else ""
    return (_end_to_end(view, badge, num) if "end_to_end" in view else "") + cache


def _cache(cache: dict[str, Any], badge: Any) -> str:
    """The denoiser's cache: one row per fact (the policy, the steps skipped, the PSNR against no cache)."""
    rows = "".join(f"<tr><th>{escape(label)}</th><td>{escape(text)}</td></tr>" for label, text in cache["rows"])
    return (f'<section id="cache"><h2>denoiser cache (insert_teacache) {badge(cache["passed"])}</h2>'
            f"<table>{rows}</table></section>")


def _end_to_end(view: dict[str, Any], badge: Any, num: Any) -> str:
    e2e = view["end_to_end"]
    fp32, device = e2e.get("fp32") or {}, e2e.get("device") or {}
    tol = fp32.get("tolerance") or {}
    rows = [("fp32 (onnxruntime)", badge(fp32.get("passed")),
             f"latents max |diff| {num(fp32.get('latents_max_abs'))} (atol {num(tol.get('atol'))}, rtol "
             f"{num(tol.get('rtol'))}); image max |diff| {num(fp32.get('image_max_abs'))}"),
            ("device emulation", badge(device.get("passed")),
             f"cosine distance {num(device.get('cosine_distance'))} (bar {num(device.get('max_cosine_distance'))});"
             f" PSNR {num(device.get('psnr_db'))} dB" + _fp32_there(device))]
    table = "".join(f"<tr><th>{escape(a)}</th><td>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
    names = sorted(set(fp32.get("nonfinite") or {}) | set(device.get("nonfinite") or {}))
    counts = "".join(f"<tr><td>{escape(str(n))}</td>{_count((fp32.get('nonfinite') or {}).get(n))}"
                     f"{_count((device.get('nonfinite') or {}).get(n))}</tr>" for n in names)
    figures = "".join(f'<figure><img alt="{escape(CAPTIONS[k])}" src="{uri}" width="192" height="192">'
                      f"<figcaption>{escape(CAPTIONS[k])}</figcaption></figure>" for k, uri in view["images"].items())
    return (f'<section id="end-to-end"><h2>end-to-end check: {escape(str(view.get("class")))} '
            f'{badge(e2e.get("passed"))}</h2>'
            f"<p>prompt <code>{escape(str(e2e.get('prompt')))}</code>, {escape(str(e2e.get('steps')))} steps, "
            f"guidance {escape(str(e2e.get('guidance_scale')))}, seed {escape(str(e2e.get('seed')))}</p>"
            f"<table>{table}</table>"
            f'<table id="nonfinite"><tr><th>component</th><th>NaN / Inf, fp32</th><th>NaN / Inf, device</th></tr>'
            f"{counts}</table>"
            f'<div class="images">{figures}</div></section>')


def _fp32_there(device: dict[str, Any]) -> str:
    """The components the device loop ran in fp32, as their own device check did not emulate them (large graphs)."""
    skipped = device.get("not_emulated")
    if not isinstance(skipped, dict) or not skipped:
        return ""
    return "; not emulated, run in fp32: " + escape(", ".join(f"{n} ({r})" for n, r in skipped.items()))


def _count(value: Any) -> str:
    if not isinstance(value, int):
        return "<td></td>"
    return f'<td class="bad">{value}</td>' if value else "<td>0</td>"
