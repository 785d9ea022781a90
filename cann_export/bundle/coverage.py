"""What a bundle's parity covered against what ATC will build from it, read from the manifest's own records
(``atc.dynamic``: the axes with their gears or range ends; ``parity.shapes``: the sizes parity ran at;
``parity.shape_budget``: the sizes the element budget left out).

With gears ATC builds one profile per combination of the axes' gears (``--dynamic_dims``: their product); by
default parity runs each axis at its gears with the others at the example's size, so it covers a few of them.
With ranges ATC accepts every size in each range; parity runs each axis at its ends and middle (a multi-graph
component: within the element budget). ``--parity full`` runs every gear combination (ranges: every combination
of the ends)."""
from __future__ import annotations

import itertools
from typing import Any

GEAR_FORMS = ("dynamic_dims", "dynamic_batch_size", "dynamic_image_size")
FULL = "full"
DEFAULT = "axes"
MAX_PROFILES = 100  # ATC's own bound on --dynamic_dims profiles (atc/dynamic_form.py)


def _axes(manifest: dict[str, Any]) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """The ATC form and the dynamic axes by name (the first axis of each name), checked as plain data."""
    atc = manifest.get("atc") if isinstance(manifest.get("atc"), dict) else {}
    dyn = atc.get("dynamic") if isinstance(atc.get("dynamic"), dict) else {}
    named: dict[str, dict[str, Any]] = {}
    for a in dyn.get("axes") if isinstance(dyn.get("axes"), list) else []:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or a["name"] in named:
            continue
        low, high = a.get("min"), a.get("max")
        if not (_whole(low) and _whole(high)):
            continue
        gears = a.get("gears")
        named[a["name"]] = {"min": low, "max": high,
                            "gears": sorted(set(gears)) if isinstance(gears, list) and all(map(_whole, gears))
                            and gears else None}
    form = dyn.get("form") if isinstance(dyn.get("form"), str) else None
    if form in GEAR_FORMS:  # a range rendered as gears: its ends and the powers of two between (dynamic.py)
        from ..dynamic import range_gears

        for a in named.values():
            if a["gears"] is None and 0 < a["min"] <= a["max"] <= 1 << 20:
                a["gears"] = range_gears(a["min"], a["max"])
    if not named:  # a multi-graph component: its ranges are in its ATC command's hints
        from .graph_shape_check import range_bounds

        bounds = range_bounds(manifest) or {}
        named = {name: {"min": low, "max": high, "gears": None} for name, (low, high) in bounds.items()}
    return form, named


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def profiles(named: dict[str, dict[str, Any]], gear_form: bool) -> list[dict[str, int]]:
    """Every size combination ATC builds (gears) or every combination of the range ends (ranges)."""
    sizes = [(a["gears"] if gear_form and a["gears"] else sorted({a["min"], a["max"]})) for a in named.values()]
    return [dict(zip(named, combo, strict=True)) for combo in itertools.product(*sizes)]


def of(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The coverage of one graph's bundle (None when it has no dynamic axes or ran no parity): ``form`` ("gears"
    or "ranges"), ``profiles`` (ATC's gear combinations, or the ranges' end combinations), ``covered`` (how many
    of them parity ran at), ``mode`` ("full" or "axes"), and per axis ``built`` [lo, hi] and ``checked`` [lo, hi]."""
    parity = manifest.get("parity") if isinstance(manifest.get("parity"), dict) else {}
    if not parity.get("validated"):
        return None
    form, named = _axes(manifest)
    if not named:
        return None
    rows = parity.get("shapes") if isinstance(parity.get("shapes"), list) else []
    shapes = [r["shape"] for r in rows if isinstance(r, dict) and isinstance(r.get("shape"), dict)]
    gear_form = form in GEAR_FORMS and all(a["gears"] for a in named.values())
    wanted = profiles(named, gear_form)
    seen = [{k: s.get(k) for k in named} for s in shapes]
    covered = sum(1 for p in wanted if p in seen)
    axes = {}
    for name, a in named.items():
        ran = [s[name] for s in shapes if _whole(s.get(name))]
        axes[name] = {"built": [a["min"], a["max"]], "checked": [min(ran), max(ran)] if ran else None}
    mode = parity.get("coverage") if parity.get("coverage") in (FULL, DEFAULT) else DEFAULT
    return {"form": "gears" if gear_form else "ranges", "profiles": len(wanted), "covered": covered, "mode": mode,
            "axes": axes}


def sentence(cov: dict[str, Any] | None) -> str | None:
    """``3 of 9 ATC profiles (each axis at its gears, the others at the example's size); batch checked to 49 of
    64`` (None without dynamic axes)."""
    if cov is None:
        return None
    if cov["form"] == "gears":
        how = "every combination" if cov["mode"] == FULL else "each axis at its gears, the others at the example's size"
        head = f"{cov['covered']} of {cov['profiles']} ATC profiles ({how})"
    else:
        how = ("every combination of the ends" if cov["mode"] == FULL
               else "each axis at its ends and middle, the others at the example's size")
        head = f"{cov['covered']} of {cov['profiles']} combinations of the ATC ranges' ends ({how})"
    short = [f"{name} checked to {a['checked'][1]} of {a['built'][1]}" if a["checked"] else f"{name} not checked"
             for name, a in cov["axes"].items() if not a["checked"] or a["checked"][1] < a["built"][1]]
    low = [f"{name} checked from {a['checked'][0]}, built from {a['built'][0]}"
           for name, a in cov["axes"].items() if a["checked"] and a["checked"][0] > a["built"][0]]
    return "; ".join([head, *short, *low])


def hint(cov: dict[str, Any] | None) -> str | None:
    """What checks the rest, when parity left some of ATC's profiles (range-end combinations) out."""
    if cov is None or cov["mode"] == FULL:
        return None
    capped = any(a["checked"] is None or a["checked"][1] < a["built"][1] for a in cov["axes"].values())
    if cov["covered"] < cov["profiles"] or capped:
        return f"--parity full checks all {cov['profiles']}" + (" and past the element budget" if capped else "")
    return None


def on_verdict(manifest: dict[str, Any] | None) -> str:
    """`` on 3 of 9 ATC profiles (...) [--parity full checks all 9]``: what parity covered of what ATC builds, and
    what checks the rest, for a verdict line; "" for a graph without dynamic axes."""
    found = of(manifest or {})
    if found is None:
        return ""
    more = hint(found)
    return f" on {sentence(found)}" + (f" [{more}]" if more else "")
