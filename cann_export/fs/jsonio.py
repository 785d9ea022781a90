"""The one JSON encoder for everything cann-export writes or prints: strict RFC 8259, no ANSI escapes.

A non-finite float (NaN, +inf, -inf) becomes ``null``; the dict that held it gains
``"non_finite": {"key": "nan" | "inf" | "-inf"}`` so the value is not lost. Strings lose terminal
escape sequences (exporters colour their messages). The result always parses with a strict parser.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI/VT100 escape sequences (colours, cursor moves, OSC links)."""
    return _ANSI.sub("", text)


def _word(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _is_bad_float(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def sanitize(data: Any) -> Any:
    """A copy of ``data`` that ``json.dumps(..., allow_nan=False)`` accepts (see the module docstring)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        flags: dict[str, str] = {}
        for key, value in data.items():
            key = strip_ansi(str(key)) if not isinstance(key, str) else strip_ansi(key)
            value = _scalar(value)
            if _is_bad_float(value):
                flags[key] = _word(value)
                out[key] = None
            else:
                out[key] = sanitize(value)
        if flags:
            previous = out.get("non_finite")
            out["non_finite"] = {**previous, **flags} if isinstance(previous, dict) else flags
        return out
    if isinstance(data, (list, tuple, set, frozenset)):
        items = sorted(data, key=str) if isinstance(data, (set, frozenset)) else data
        return [None if _is_bad_float(v := _scalar(x)) else sanitize(v) for x in items]
    data = _scalar(data)
    if _is_bad_float(data):
        return None
    if isinstance(data, str):
        return strip_ansi(data)
    if data is None or isinstance(data, (bool, int, float)):
        return data
    if isinstance(data, Path):
        return str(data)
    return strip_ansi(str(data))


def _scalar(value: Any) -> Any:
    """numpy / torch scalars and 0-d arrays as Python numbers; other values unchanged."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", None) == 0 and not isinstance(value, (str, bytes)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    if hasattr(value, "tolist") and hasattr(value, "ndim"):  # numpy arrays
        return value.tolist()
    return value


def dumps(data: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of ``data`` (sanitised first)."""
    return json.dumps(sanitize(data), indent=indent, allow_nan=False)


def dump_file_text(data: Any) -> str:
    """Text of a JSON file we write (indented, newline-terminated)."""
    return dumps(data, indent=2) + "\n"


def loads_strict(text: str | bytes, infinities: bool = False) -> Any:
    """Parse JSON the way strict parsers (Node's JSON.parse) do: NaN / Infinity are errors, and so is an object
    that names a key twice (readers disagree on which value wins); a number past the float range (``1e999``,
    which Python would read as inf) is refused like the Infinity literal. ``infinities``: the literals
    ``Infinity`` / ``-Infinity`` are read (diffusers writes them in a scheduler's config), NaN still refused."""

    def refuse(name: str) -> Any:
        if infinities and name in ("Infinity", "-Infinity"):
            return float(name.replace("Infinity", "inf"))
        raise ValueError(f"not RFC 8259 JSON: {name}")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"the number {text[:40]} is past the float range (it would read as {value})")
        return value

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"the key {twice[:80]!r} appears twice in one object")
        return out

    return json.loads(text, parse_constant=refuse, parse_float=finite, object_pairs_hook=unique)
