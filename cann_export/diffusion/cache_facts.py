"""The denoiser's cache as a reader sees it (report.html's cache section, ``cann-export inspect``'s cache lines): the
policy the manifest records (``pipeline.cache``: the cached block range, TeaCache's threshold or DeepCache's step
interval, the graphs) and what the export measured (``pipeline.end_to_end.cache``: the steps skipped, the PSNR
against the uncached image, the cache off against no cache). Plain-text rows, controls already shown escaped; each
view escapes them for its own sink.

A manifest is untrusted: any value of any type renders as text and nothing here raises. A non-finite number is
written by the strict JSON writer as ``null`` beside its word in the dict's ``non_finite`` (fs/jsonio.py); it shows
as that word (``nan``, ``inf``), as does a non-finite float handed in directly."""
from __future__ import annotations

import math
from typing import Any

from ..safe_text import terminal

MAX_TEXT = 120  # a string from the manifest, shown at most this long
MAX_STEPS = 24  # skipped step indices listed before "..."


def cache_rows(pipeline: Any) -> list[tuple[str, str]]:
    """(label, text) rows of a pipeline section's cache; [] when it records none."""
    section = pipeline.get("cache") if isinstance(pipeline, dict) else None
    if not isinstance(section, dict):
        return []
    e2e = pipeline.get("end_to_end")
    measured = e2e.get("cache") if isinstance(e2e, dict) else None
    policy = section.get("policy") if isinstance(section.get("policy"), dict) else {}
    rows = [("cached range", _range(section)), ("policy", _policy(section, policy)),
            ("graphs", _graphs(section.get("graphs")))]
    if not isinstance(measured, dict):
        return rows + [("measured at export", "not measured (exported with --no-validate)")]
    return rows + [("measured at export", _at_setting(measured)), ("cache off", _off(measured)),
                   ("verdict", _verdict(measured.get("passed")))]


def cache_passed(pipeline: Any) -> bool | None:
    """The measure's verdict (None: no cache, or not measured)."""
    e2e = pipeline.get("end_to_end") if isinstance(pipeline, dict) else None
    measured = e2e.get("cache") if isinstance(e2e, dict) else None
    passed = measured.get("passed") if isinstance(measured, dict) else None
    return passed if isinstance(passed, bool) else None


def number(holder: Any, key: str, spec: str = ".4g") -> str:
    """``holder[key]`` as text: a finite number formatted, a non-finite one (or the null the strict writer left with
    its ``non_finite`` word) as its word, anything else as short text; "n/a" when absent."""
    value = holder.get(key) if isinstance(holder, dict) else None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return format(value, spec) if math.isfinite(value) else str(value)
        except OverflowError:  # an integer past float's range (JSON allows any length): shown as digits
            return text(value)
    if value is None:
        words = holder.get("non_finite") if isinstance(holder, dict) else None
        word = words.get(key) if isinstance(words, dict) else None
        return text(word) if word is not None else "n/a"
    return text(value)


def text(value: Any) -> str:
    """Any value as one short line, its control and invisible characters shown escaped (safe_text.terminal)."""
    shown = terminal(" ".join(str(value).split()))
    return shown if len(shown) <= MAX_TEXT else shown[:MAX_TEXT - 3] + "..."


def _range(section: dict[str, Any]) -> str:
    bounds = section.get("range")
    blocks = ""
    if isinstance(bounds, list) and len(bounds) == 2 and all(type(b) is int for b in bounds):
        blocks = f" (blocks {bounds[0]} to {bounds[1] - 1})" if bounds[1] - bounds[0] > 1 else f" (block {bounds[0]})"
    return f"{text(section.get('module'))}{blocks}"


def _policy(section: dict[str, Any], policy: dict[str, Any]) -> str:
    forced = section.get("force_full")
    always = (f"; always in full: {', '.join(text(f) for f in forced)}"
              if isinstance(forced, list) and forced else "")
    kind = policy.get("kind")
    if kind == "relative_l1":
        return (f"TeaCache: a step skips the range while the accumulated relative L1 change of "
                f"{text(policy.get('measures', 'the modulated input'))} stays under the threshold "
                f"{number(policy, 'threshold')} (0: the cache off){always}")
    if kind == "interval":
        return f"DeepCache: the full graph every {number(policy, 'every')} steps, the skip graph between{always}"
    return f"{text(kind)} (not a policy this tool records){always}"


def _graphs(graphs: Any) -> str:
    if not isinstance(graphs, dict):
        return "n/a"
    return ", ".join(f"{text(role)} {text(name)}" for role, name in graphs.items()) or "n/a"


def _at_setting(measured: dict[str, Any]) -> str:
    at = measured.get("at_setting") if isinstance(measured.get("at_setting"), dict) else {}
    steps = at.get("skipped_steps")
    listed = ""
    if isinstance(steps, list) and steps:
        shown = ", ".join(text(s) for s in steps[:MAX_STEPS]) + (", ..." if len(steps) > MAX_STEPS else "")
        listed = f" (steps {shown})"
    if at.get("psnr_db") is None and at.get("max_abs") == 0:
        quality = "the image equals the uncached one"
    else:
        quality = f"PSNR {number(at, 'psnr_db')} dB against the uncached image (max |diff| {number(at, 'max_abs')})"
    return f"{number(at, 'skipped')} of {number(measured, 'steps')} steps skipped{listed}; {quality}"


def _off(measured: dict[str, Any]) -> str:
    off = measured.get("off") if isinstance(measured.get("off"), dict) else {}
    policy = off.get("policy") if isinstance(off.get("policy"), dict) else {}
    setting = f"threshold {number(policy, 'threshold')}" if "threshold" in policy else \
        f"every {number(policy, 'every')} step" if "every" in policy else "off"
    return (f"{setting}: max |diff| {number(off, 'max_abs')} against the uncached image "
            f"(atol {number(off, 'atol')})")


def _verdict(passed: Any) -> str:
    if passed is True:
        return "passed (the cache off equals no cache; the image at the setting is finite)"
    if passed is False:
        return "FAILED (the cache off differs from no cache, or the image at the setting is not finite)"
    return f"not recorded ({text(passed)})"
