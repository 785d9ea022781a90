"""Trace specialisation: a traced graph (TorchScript fallback) only knows the path the example took.

When tracing warned (a tensor turned into a Python bool / int / float / list, data-dependent control
flow), the capture stage records each warning with its source line, parity also runs inputs that may
take other paths (sign-flipped and scaled copies of the example), and the export fails unless the user
accepts a graph specialised to the traced path (``--accept-trace-specialization``) or, under ``--exporter auto``,
the trace gate (exporter_choice.py) checked it against the model on every prepared input set first.
"""
from __future__ import annotations

import linecache
from typing import Any

_KINDS = (("boolean", "bool"), ("integer", "int"), ("float", "float"), ("index", "int"), ("list", "list"),
          ("iterating", "iteration"))


def _generated(filename: str) -> bool:
    """Code torch generated (fx's ``<eval_with_key>`` modules) or torch's own functions (torch.export's input
    guards call ``torch._assert``): not a branch of the user's code that tracing specialised."""
    import os

    import torch

    name = str(filename)
    if name.startswith("<eval_with_key"):
        return True
    return name.startswith(os.path.dirname(torch.__file__) + os.sep)  # torch's own code (e.g. torch._assert guards)


def tracer_findings(records: list[Any]) -> list[dict[str, Any]]:
    """TracerWarnings (``warnings.WarningMessage`` entries, with the ``stack`` trace_guards.recorder adds) as
    findings with their source file, line and code; one per source line. ``guard``: every time it warned, the line
    was an input check (capture/trace_guards.py), which specialises nothing."""
    import torch

    from .trace_guards import Sources, is_guard

    out: dict[tuple[str, int], dict[str, Any]] = {}
    sources = Sources()
    converted_inside_torch = False  # torch's own code turned a tensor into a Python value (``int(split_size)``)
    for w in records:
        if not issubclass(w.category, torch.jit.TracerWarning):
            continue
        if _generated(w.filename):  # not the model's: it only voids the tests of sizes, unless a check or a size
            converted_inside_torch |= not (getattr(w, "tested", None) in ("sizes", "constant")
                                           or is_guard(w.filename, w.lineno, getattr(w, "stack", None), sources))
            continue
        tested = getattr(w, "tested", None)
        guard = tested == "constant" or is_guard(w.filename, w.lineno, getattr(w, "stack", None), sources)
        sizes = guard or tested == "sizes"
        key = (w.filename, w.lineno)
        if key in out:
            out[key]["guard"] = out[key]["guard"] and guard
            out[key]["sizes"] = out[key]["sizes"] and sizes
            continue
        message = " ".join(str(w.message).split())
        kind = next((k for word, k in _KINDS if word in message.lower()), "other")
        code = linecache.getline(w.filename, w.lineno).strip()
        out[key] = {"file": _library_relative(w.filename), "line": w.lineno, "code": code,
                    "kind": kind, "message": message.split(". ")[0].rstrip("."), "guard": guard, "sizes": sizes}
    if converted_inside_torch:  # a value may have sized a tensor there, unseen: no test is one of sizes only
        for finding in out.values():
            finding["sizes"] = finding["guard"]
    return list(out.values())


def path_dependent(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that may specialise the graph to the example's path (all but the input checks and literal
    constants)."""
    return [_unflagged(f) for f in findings if not f.get("guard")]


def guards(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input checks the trace passed and the literal constants it registered (the capture record's
    ``guards``)."""
    return [_unflagged(f) for f in findings if f.get("guard")]


def value_dependent(findings: list[dict[str, Any]]) -> bool:
    """Whether a finding may depend on input values (not only on sizes: capture/shape_tests.py), which the path
    probes (inputs/path_probes.py) are for."""
    return any(not f.get("sizes") for f in findings)


def _unflagged(finding: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in finding.items() if k not in ("guard", "sizes")}


def where(finding: dict[str, Any]) -> str:
    code = f" `{finding['code']}`" if finding.get("code") else ""
    return f"{short_file(finding['file'])}:{finding['line']}{code} ({finding['message']})"


def _library_relative(path: str) -> str:
    """An installed library's file from its package on (the record names no venv or home directory), else as given."""
    import os

    for marker in ("site-packages", "dist-packages"):
        head, sep, tail = str(path).rpartition(os.sep + marker + os.sep)
        if sep:
            return tail
    return str(path)


def short_file(path: Any) -> str:
    """A source file as a user reads it: from its package on (``transformers/masking_utils.py``) for an installed
    library, relative to the working directory for the user's own code, else as given."""
    import os

    text = _library_relative(str(path))
    if text != str(path):
        return text
    relative = os.path.relpath(text) if os.path.isabs(text) else text
    return relative if not relative.startswith("..") else text


def short_line(spec: dict[str, Any]) -> str:
    """The CLI's one line on a traced graph specialised to the example's path: how many places, where (file:line,
    what tracing turned into a Python value), and over which sizes of which dimensions it was checked."""
    found = spec.get("warnings") or []
    places = ", ".join(f"{short_file(f.get('file'))}:{f.get('line')} ({f.get('kind')})" for f in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    checked = spec.get("checked")
    if checked:
        sizes: dict[str, set[int]] = {}
        for shape in checked.get("shapes") or []:
            for dim, size in shape.items():
                sizes.setdefault(str(dim), set()).add(int(size))
        dims = ", ".join(f"{d} {min(v)}..{max(v)}" for d, v in sizes.items())
        probes = checked.get("path_variants") or 0
        state = f"agrees with the model on the {checked.get('input_sets')} input sets checked" + (
            f" ({dims})" if dims else "") + (f", {probes} of them sign-flipped / scaled probes" if probes else
                                             ", no probe: it tested sizes only" if spec.get("probes") else "")
    else:
        state = "accepted unchecked" if spec.get("accepted") else "not accepted"
    return (f"traced graph, specialised to the example's path at {len(found)} place(s): {places}{more}; {state} "
            "(`cann-export inspect` shows the code)")


def record(ctx: Any, findings: list[dict[str, Any]], checked: dict[str, Any] | None = None) -> None:
    """Mark the capture as specialised to the traced path; refuse when parity cannot show it. ``checked``: the
    trace gate found the graph agreeing with the model on every prepared input set (a warning, not a failure)."""
    from ..errors import CaptureError

    accepted = bool(ctx.options.accept_trace_specialization)
    ctx.capture.specialized = {"traced_path_only": True, "accepted": accepted, "warnings": findings}
    from ..inputs.path_probes import prepared_paths

    if not ctx.trace_probes and not prepared_paths(ctx) and not ctx.path_input_sets:
        ctx.capture.specialized["probes"] = ("none: every warning tests sizes only and no size in the graph depends on "
                                             "input values (checked at the sizes of its ranges)")
    if checked is not None:
        ctx.capture.specialized["checked"] = {k: checked[k] for k in ("input_sets", "path_variants", "shapes")}
        ctx.reports.warnings.trace = summary(checked)
        return
    if not accepted and not ctx.options.validate:
        raise CaptureError(message(findings, None), path=ctx.loaded.source_path if ctx.loaded else None)


def message(findings: list[dict[str, Any]], other: dict[str, Any] | None) -> str:
    shown = "; ".join(where(f) for f in findings[:3]) + (f" (+{len(findings) - 3} more)" if len(findings) > 3 else "")
    text = (f"the graph comes from tracing (TorchScript fallback) and is specialised to the path the example "
            f"inputs took: tracing turned tensors into Python values at {shown}")
    if other is not None:
        worst = max((o.get("max_abs") for o in other.get("outputs", []) if o.get("max_abs") is not None),
                    default=None)
        first = f" (first on {other['first_failing']})" if other.get("first_failing") else ""
        text += ("; on inputs that take other paths (sign-flipped / scaled) the graph "
                 + ("agrees, but other inputs may still differ" if other.get("passed") else
                    f"is off by {worst:.3g} max abs{first}" if worst is not None else f"differs{first}"))
    return (text + ". Make the forward traceable (torch.where / torch.cond instead of Python control flow on "
            "tensors) or pass --accept-trace-specialization (accept_trace_specialization=True) to accept a graph "
            "that is valid only on that path")


def apply_verdict(report: dict[str, Any], ctx: Any, other: dict[str, Any] | None) -> dict[str, Any]:
    """Record the trace specialisation in the parity report; it fails unless accepted or checked by the trace gate
    (whose sets parity has just judged again on the written graph, path variants included)."""
    return apply_specialisation(report, ctx.capture.specialized, other)


def apply_specialisation(report: dict[str, Any], spec: dict[str, Any] | None,
                         other: dict[str, Any] | None) -> dict[str, Any]:
    """``apply_verdict`` from the capture's ``specialized`` record (the context's, or a bundle manifest's
    ``capture.specialized``, which validate re-derives the verdict with)."""
    if not spec:
        return report
    if other is not None:
        failing = next((f.get("kind") for f in other.get("failing_sets") or [] if isinstance(f, dict)), None)
        other = {"input_sets": other.get("input_sets"), "passed": other.get("passed"),
                 "reference": other.get("reference"),
                 "outputs": [{k: o[k] for k in ("name", "max_abs", "cosine", "passed") if k in o}
                             for o in other.get("outputs", [])],
                 **({"first_failing": str(failing)[:80]} if failing and not other.get("passed") else {})}
    report["trace_specialized"] = {"accepted": spec["accepted"], "warnings": spec["warnings"],
                                   **({"checked": spec["checked"]} if spec.get("checked") else {}),
                                   **({"probes": spec["probes"]} if spec.get("probes") else {}),
                                   **({"other_paths": other} if other is not None else {})}
    if spec.get("checked") and other is not None and not other.get("passed"):  # the written graph, unlike the trace
        report["passed"] = False
        earlier = report.get("reason")
        report["reason"] = message(spec["warnings"], other) + (f"; also {earlier}" if earlier else "")
    elif not spec["accepted"] and not spec.get("checked"):
        report["passed"] = False
        earlier = report.get("reason")
        report["reason"] = message(spec["warnings"], other) + (f"; also {earlier}" if earlier else "")
    return report


def summary(result: dict[str, Any]) -> str:
    """The manifest's warning for a trace the trace gate (exporter_choice.py) checked and kept."""
    shapes = "; ".join(",".join(f"{k}={v}" for k, v in s.items()) for s in result.get("shapes") or [])
    return (f"the graph comes from tracing, which warned (capture.specialized names where); it "
            f"agrees with the model on the {result['input_sets']} input sets it was checked on"
            + (f" (shapes {shapes})" if shapes else "")
            + ", so inputs beyond those may still take a path the trace did not record")
