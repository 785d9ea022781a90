"""The names and types of a single-graph manifest.json against what ``bundle.manifest.build_manifest`` writes:
an allow-list of the top-level sections and of the names inside those the writer's dataclasses fix (``model``,
``capture`` and its attempts, ``warnings``, ``quantization``, ``sandbox``), each value's type, and the claims
that must agree with one another (``capture``'s exporter and opset are ``model``'s; no lint passes beside a
finding of severity error). ``rederive`` checks what the files can tell (the graph's opset, its metadata).
Each problem is a string naming the field; ``read.read_bundle`` refuses a manifest with any."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..context import CaptureAttempt, CaptureReport, QuantizationReport, Warnings

TOP = ("schema", "format", "model", "metadata", "provenance", "atc", "capture", "optimize", "parity", "quantization",
       "lint", "sandbox", "warnings", "stage_seconds", "files")
MODEL_KEYS = ("file", "opset", "opset_requested", "exporter", "inputs", "outputs", "ops", "static_axes")
SANDBOX_KEYS = {"none": ("kind", "reason"), "landlock+seccomp": ("kind", "landlock_abi", "denies")}
SANDBOX_OPTIONAL = {"landlock+seccomp": ("torch_threads",)}  # a single graph's record (pipeline/sandboxed_file.plan)
MAX_REASON = 4096
MAX_LANDLOCK_ABI = 255
MAX_SECONDS = 10 * 365 * 24 * 3600.0
SHOWN = 10  # problems of one kind named, at most


def unknown_names(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> list[str]:
    """The keys of ``value`` the writer does not write at ``where``."""
    return [f"{where or 'the top level'}: field {str(k)[:80]!r} is not one this tool writes there (refused)"
            for k in [k for k in value if k not in allowed][:SHOWN]]


def _dataclass_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _is_int(value: Any) -> bool:
    return type(value) is int


def section_problems(manifest: dict[str, Any]) -> list[str]:
    """The top-level names and the sections ``read.manifest_problems`` leaves to this module (its common shape,
    ``model``'s values and the file table, already passed)."""
    problems = unknown_names(manifest, TOP, "")
    model = manifest["model"]
    problems += unknown_names(model, MODEL_KEYS, "model")
    for key in ("opset", "opset_requested"):
        value = model.get(key, None if key == "opset" else 1)  # the opset asked for is optional
        if not (_is_int(value) and 1 <= value <= 1000):
            problems.append(f"model.{key}: missing or not an opset number")
    if not isinstance(model.get("exporter"), str):
        problems.append("model.exporter: missing or not a name")
    problems += _capture_problems(manifest.get("capture"), model)
    for key in ("optimize", "lint", "warnings", "stage_seconds", "quantization"):
        if key in manifest and not isinstance(manifest[key], dict):
            problems.append(f"{key}: a {type(manifest[key]).__name__}, not an object")
    if isinstance(manifest.get("warnings"), dict):
        problems += unknown_names(manifest["warnings"], _dataclass_names(Warnings), "warnings")
        problems += [f"warnings.{k}: not a text or a list of texts" for k, v in manifest["warnings"].items()
                     if not (isinstance(v, str) or isinstance(v, list) and all(isinstance(s, str) for s in v))]
    if isinstance(manifest.get("quantization"), dict):
        problems += unknown_names(manifest["quantization"], _dataclass_names(QuantizationReport), "quantization")
    if isinstance(manifest.get("stage_seconds"), dict):
        problems += [f"stage_seconds.{str(k)[:40]}: not a number of seconds" for k, v in
                     manifest["stage_seconds"].items() if not _is_seconds(v)][:SHOWN]
    if isinstance(manifest.get("lint"), dict):
        problems += _lint_problems(manifest["lint"])
    if "sandbox" in manifest:
        problems += sandbox_problems(manifest["sandbox"])
    return problems


def _is_seconds(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value <= MAX_SECONDS  # an int compared, never converted: no overflow


def _capture_problems(capture: Any, model: dict[str, Any]) -> list[str]:
    """``capture``: the CaptureReport's names; the exporter and opset it reports are the ones ``model`` names
    (the graph's opset and the provenance stamped in the graph are checked against ``model`` by rederive)."""
    if not isinstance(capture, dict):  # the writer always records its capture
        return [f"capture: a {type(capture).__name__}, not an object"]
    problems = unknown_names(capture, _dataclass_names(CaptureReport), "capture")
    for key in ("exporter", "opset", "opset_requested"):
        if key in capture and key in model and capture[key] != model[key]:
            problems.append(f"capture.{key}: {str(capture[key])[:80]!r}, but model.{key} is {str(model[key])[:80]!r}")
    attempts = capture.get("attempts", [])
    if not isinstance(attempts, list) or not all(isinstance(a, dict) and isinstance(a.get("exporter"), str)
                                                 for a in attempts):
        return problems + ["capture.attempts: not a list of exporter attempts"]
    allowed = _dataclass_names(CaptureAttempt)
    problems += [p for k, a in enumerate(attempts) for p in unknown_names(a, allowed, f"capture.attempts[{k}]")]
    if "exporter" in capture and attempts and not any(a["exporter"] == capture["exporter"] and "error" not in a
                                                      for a in attempts):
        problems.append(f"capture.exporter: {str(capture['exporter'])[:80]!r} is not an exporter whose attempt "
                        "wrote a graph")
    return problems


def _lint_problems(lint: dict[str, Any]) -> list[str]:
    """Each linter's report: findings as a list of objects, a ``passed`` that is a verdict, and never
    ``passed: true`` beside a finding of severity error (whatever else a plugin's linter decides)."""
    problems = []
    for name, report in lint.items():
        findings = report.get("findings", []) if isinstance(report, dict) else None
        if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
            problems.append(f"lint.{str(name)[:40]}: not a linter's report (findings a list of objects)")
        elif "passed" in report and not isinstance(report["passed"], bool):
            problems.append(f"lint.{str(name)[:40]}.passed: not true / false")
        elif report.get("passed") is True and any(f.get("severity") == "error" for f in findings):
            problems.append(f"lint.{str(name)[:40]}.passed: true beside a finding of severity error (a lint with an "
                            "error does not pass)")
    return problems


def sandbox_problems(record: Any, optional: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """``sandbox``: one of the records this tool writes: ``{kind: "none", reason}`` (why the load was not
    confined) or ``{kind: "landlock+seccomp", landlock_abi, denies}`` (the kernel's Landlock ABI, the writer's
    own list of what the load was denied; a single graph's record adds ``torch_threads``: ``"all"`` or 1).
    ``optional``: the names a record kind may add (a multi-graph bundle's top level: none)."""
    optional = SANDBOX_OPTIONAL if optional is None else optional
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str) or record["kind"] not in SANDBOX_KEYS:
        shown = record.get("kind") if isinstance(record, dict) else type(record).__name__
        return [f"sandbox: {str(shown)[:80]!r} is not a sandbox record this tool writes (its kind one of "
                f"{', '.join(SANDBOX_KEYS)})"]
    kind = record["kind"]
    problems = unknown_names(record, SANDBOX_KEYS[kind] + optional.get(kind, ()), "sandbox")
    problems += [f"sandbox.{k}: missing (a {kind!r} record has {', '.join(SANDBOX_KEYS[kind])})"
                 for k in SANDBOX_KEYS[kind] if k not in record]
    if kind == "none":
        reason = record.get("reason")
        if "reason" in record and not (isinstance(reason, str) and 0 < len(reason) <= MAX_REASON):
            problems.append(f"sandbox.reason: not a text of 1..{MAX_REASON} characters")
        return problems
    # the one list both confined runs record (pipeline/sandboxed_file.py, pipeline/sandboxed_directory.py)
    from ..pipeline.sandboxed_file import DENIES

    abi = record.get("landlock_abi")
    if "landlock_abi" in record and not (_is_int(abi) and 1 <= abi <= MAX_LANDLOCK_ABI):
        problems.append(f"sandbox.landlock_abi: {str(abi)[:40]} is not a Landlock ABI (1..{MAX_LANDLOCK_ABI}) of a "
                        "confined load")
    if "denies" in record and record["denies"] != DENIES:
        problems.append("sandbox.denies: not the list of what this tool's load sandbox denies")
    threads = record.get("torch_threads", "all")
    if not (threads == "all" or _is_int(threads) and threads == 1):
        problems.append("sandbox.torch_threads: not 'all' or 1 (the threads torch ran on in the sandboxed child)")
    return problems
