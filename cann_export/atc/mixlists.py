"""ATC's mixed-precision lists: per SoC family, white (reduced), black (kept fp32) and gray (every other type: it
follows the op that feeds it), from ``data/mixlists.json`` (which records its sources), and ``--modify_mixlist``
edits (``{"black-list": {"to-add": [...], "to-remove": [...]}, "white-list": ..., "gray-list": ...}``) in
Ascend IR op types, checked before any work.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .customize import Custom

# the modes that reduce by the lists, and the dtype they reduce to
FP16_MIXED = ("allow_mix_precision", "allow_mix_precision_fp16", "mixed_float16", "mixed_hif8")
BF16_MIXED = ("allow_mix_precision_bf16", "mixed_bfloat16", "allow_fp32_to_bf16")
LISTS = ("black-list", "white-list", "gray-list")
EDITS = ("to-add", "to-remove")
MAX_ENTRIES = 4096  # op types in one modify_mixlist file, all lists together


@lru_cache(maxsize=1)
def data() -> dict[str, Any]:
    return json.loads(files("cann_export.atc.data").joinpath("mixlists.json").read_text(encoding="utf-8"))


def family(soc: str | None) -> str:
    """The list family of an ATC --soc_version (an unknown or absent name: the default family)."""
    soc = soc or ""
    if re.fullmatch(r"Ascend910B\d.*", soc):
        return "ascend910b"
    if soc.startswith("Ascend910_93"):
        return "ascend910_93"
    if soc.startswith("Ascend310P"):
        return "ascend310p"
    return "default"


@dataclass(frozen=True)
class MixLists:
    """The white and black Ascend IR types of one SoC family, after the user's edits, and the customize_dtypes
    entries (which override the lists and keep_dtype for the nodes they name)."""

    family: str
    white: frozenset[str]
    black: frozenset[str]
    edited: bool = False
    custom: tuple[Custom, ...] = ()

    def policy(self, ascend_type: str) -> str:
        if ascend_type in self.white:
            return "white"
        return "black" if ascend_type in self.black else "gray"

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "white": sorted(self.white), "black": sorted(self.black),
                "modified": self.edited, "source": data()["rule_source"]}


def lists_for(soc: str | None, edits: dict[str, Any] | None = None, custom: Any = None) -> MixLists:
    """The lists ATC applies on ``soc`` (the bf16 modes read the same precision_reduce flag: data's bf16_source),
    with ``edits`` (a checked modify_mixlist) applied: removals first (to gray), then additions; ``custom``: the
    customize_dtypes hint (its cfg lines)."""
    from .customize import parse

    name = family(soc)
    fam = data()["families"][name]
    white, black = set(fam["white"]), set(fam["black"])
    for key in EDITS[::-1]:  # to-remove, then to-add
        for lst in LISTS:
            for op in (edits or {}).get(lst, {}).get(key, []):
                white.discard(op)
                black.discard(op)
                if key == "to-add" and lst != "gray-list":
                    (black if lst == "black-list" else white).add(op)
    return MixLists(name, frozenset(white), frozenset(black), bool(edits), tuple(parse(custom)) if custom else ())


def bf16_supported(soc: str | None) -> bool:
    """Whether ATC's bf16 mixed modes exist on ``soc`` (Atlas A2/A3 only, per the bf16 source)."""
    return family(soc) in data()["bf16_families"]


def check_edits(value: Any) -> dict[str, dict[str, list[str]]]:
    """A modify_mixlist value (a dict, or its JSON text) checked: known list and edit keys, lists of Ascend IR op
    types this tool knows; raises ValueError naming the first bad entry and what to write instead."""
    from .ascend_ir import known_types, onnx_spelling

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"not JSON ({e})") from e
    if not isinstance(value, dict) or not value:
        raise ValueError('expected {"black-list": {"to-add": [...], "to-remove": [...]}, "white-list": {...}, '
                         '"gray-list": {...}}')
    known, out, count = known_types(), {}, 0
    for lst, edits in value.items():
        if lst not in LISTS:
            raise ValueError(f"unknown list {str(lst)[:60]!r}; the lists are {', '.join(LISTS)}")
        if not isinstance(edits, dict) or not set(edits) <= set(EDITS):
            raise ValueError(f"{lst}: expected an object with {' and/or '.join(EDITS)}")
        if lst == "gray-list" and "to-remove" in edits:
            raise ValueError("gray-list: to-remove has no meaning (an op leaves the gray list by being added to the "
                             "black-list or white-list)")
        for key, ops in edits.items():
            if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
                raise ValueError(f"{lst}.{key}: expected a list of op type names")
            count += len(ops)
            if count > MAX_ENTRIES:
                raise ValueError(f"more than {MAX_ENTRIES} entries")
            for op in ops:
                _check_type(op, f"{lst}.{key}", known, onnx_spelling(op))
            out.setdefault(lst, {})[key] = list(dict.fromkeys(ops))
    return out


def _check_type(op: str, where: str, known: set[str], ascend: str | None) -> None:
    if ascend is not None:
        raise ValueError(f"{where}: {op!r} is an ONNX op type; ATC's lists name Ascend IR types: write {ascend}")
    if op not in known:
        close = difflib.get_close_matches(op, sorted(known), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"{where}: {op[:80]!r} is not an Ascend IR op type this tool knows{hint}; name the type "
                         "as the op info library spells it (atc/data/ascend_ir_ops.json lists the ONNX mapping)")
