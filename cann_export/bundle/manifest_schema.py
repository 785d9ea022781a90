"""The one schema of a manifest.json, against what this tool's writers write: one graph's manifest
(``cann-export/manifest/1``, ``manifest_build.build_manifest``) and a multi-graph bundle's top level
(``cann-export/bundle/2``, ``multi_write.build_manifest``, then ``export_plan``'s ``sandbox`` record). A bundle is a
set of graphs: the top level lists its components, each a directory ``components/<name>/`` whose manifest.json is
one graph's manifest, checked by the same ``graph_problems`` (``multi_check.check_multi``); a single graph is the set
of one, its manifest at the root.

One graph: the common shape (``model``'s file, values and op histogram, the file table, the parity verdict, the ATC
options), then an allow-list of the top-level sections and of the names inside those the writer's dataclasses fix
(``model``, ``capture`` and its attempts, ``warnings``, ``quantization``, ``sandbox``), each value's type, and the
claims that must agree with one another (``capture``'s exporter and opset are ``model``'s; no lint passes beside a
finding of severity error). The top level of several graphs: the components, connections, verdict and file table,
and an allow-list of names at every level its writer fills. What the files can tell is re-derived elsewhere
(``rederive`` for one graph, ``multi_check`` for the top level). Each problem is a string naming the field; every
manifest.json is read through ``read.read_manifest``, the one reader entry, whose callers refuse one with any."""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from ..context import CaptureAttempt, CaptureReport, QuantizationReport, Warnings
from ..fs import digests
from ..plan import NAME
from .multi_write import COMPONENTS_DIR, SCHEMA

MODEL_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.onnx")
MAX_PATH_CHARS = 1024  # a file-table path, whole
MAX_NAME_BYTES = 255  # one component of it, in UTF-8 (the NAME_MAX of common file systems)
TOP = ("schema", "format", "model", "metadata", "provenance", "atc", "capture", "optimize", "parity", "quantization",
       "lint", "sandbox", "warnings", "stage_seconds", "files")
MODEL_KEYS = ("file", "opset", "opset_requested", "exporter", "inputs", "outputs", "ops", "static_axes")
SANDBOX_KEYS = {"none": ("kind", "reason"), "landlock+seccomp": ("kind", "landlock_abi", "denies")}
SANDBOX_OPTIONAL = {"landlock+seccomp": ("torch_threads",)}  # a single graph's record (pipeline/sandboxed_file.plan)
MAX_REASON = 4096
MAX_LANDLOCK_ABI = 255
MAX_SECONDS = 10 * 365 * 24 * 3600.0
SHOWN = 10  # problems of one kind named, at most
# a multi-graph bundle's top level
MAX_COMPONENTS = 64
MAX_CONNECTIONS = 100_000
TOP_REQUIRED = ("schema", "format", "kind", "components", "connections", "run", "parity", "provenance", "files")
TOP_OPTIONAL = ("atc", "sandbox", "pipeline", "precision_fix")  # pipeline: a diffusers pipeline's (diffusion/check.py)
COMPONENT_KEYS = ("name", "role", "path", "manifest_sha256", "inputs", "outputs")
CONNECTION_ENDS = {"from": ("component", "output"), "to": ("component", "input")}
PARITY_KEYS = ("passed", "components")
ATC_KEYS = ("script", "soc_version")
FILE_KEYS = ("sha256", "size")


def manifest_problems(manifest: Any, several: bool) -> list[str]:
    """Every difference between ``manifest`` and the one schema: a multi-graph bundle's top level (``several``, the
    reader found the bundle schema named) or one graph's manifest."""
    return bundle_problems(manifest) if several else graph_problems(manifest)


# One graph's manifest

def graph_problems(manifest: Any) -> list[str]:
    """Everything about one graph's manifest that differs from what an export writes: its common shape, then the
    sections' names, types and agreement (a format's own sections are checked by its ``manifest_problems``, see
    ``read.read_bundle``)."""
    if not isinstance(manifest, dict):
        return ["not a JSON object"]
    problems = []
    if not isinstance(manifest.get("schema"), str) or not manifest["schema"].startswith("cann-export/manifest/"):
        problems.append("schema: missing or not a cann-export manifest schema")
    if not isinstance(manifest.get("format"), str):
        problems.append("format: missing or not a string")
    problems += _model_problems(manifest.get("model"))
    for key in ("metadata", "provenance"):
        if key in manifest and not isinstance(manifest[key], dict):
            problems.append(f"{key}: not an object")
    if isinstance(manifest.get("metadata"), dict) and not _is_str_map(manifest["metadata"]):
        problems.append("metadata: values must be strings")
    problems += _file_table_problems(manifest.get("files"))
    problems += _parity_problems(manifest.get("parity"))
    if has_atc(manifest) or manifest.get("atc") is not None and not isinstance(manifest.get("atc"), dict):
        problems += atc_problems(manifest["atc"])
    if not problems:  # the common shape holds: the sections' names, types and agreement
        problems = section_problems(manifest)
    return problems


def has_atc(manifest: dict[str, Any]) -> bool:
    """Whether the manifest holds ATC options (a non-empty ``atc`` section): then they are checked and
    re-rendered, whatever the format."""
    return isinstance(manifest.get("atc"), dict) and bool(manifest["atc"])


def _model_problems(model: Any) -> list[str]:
    if not isinstance(model, dict):
        return ["model: missing or not an object"]
    problems = []
    file = model.get("file")
    if not isinstance(file, str) or len(file.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES \
            or not MODEL_FILE.fullmatch(file):
        shown = shown_path(file) if isinstance(file, str) else repr(file)
        problems.append(f"model.file: {shown} is not a plain .onnx file name of at most {MAX_NAME_BYTES} bytes")
    for key in ("inputs", "outputs"):
        if not _is_values(model.get(key)):
            problems.append(f"model.{key}: missing or not a list of named values")
    ops = model.get("ops")
    if not isinstance(ops, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ops.values()):
        problems.append("model.ops: missing or not an op histogram")
    return problems


def _file_table_problems(files: Any) -> list[str]:
    if not isinstance(files, dict):
        return ["files: the file table is missing or not an object"]
    problems = [f"files[{shown_path(rel)}]: {bound}" for rel in files if (bound := path_bound_problem(rel))]
    return problems + [
        f"files[{shown_path(rel)}]: not a {{sha256, size}} entry" for rel, entry in files.items()
        if not isinstance(entry, dict) or not digests.is_sha256(entry.get("sha256"))
        or not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool) or entry["size"] < 0]


def _parity_problems(parity: Any) -> list[str]:
    if not isinstance(parity, dict) or not isinstance(parity.get("validated"), bool):
        return ["parity: the parity section is missing or has no 'validated' flag"]
    problems = []
    if parity["validated"]:
        if not isinstance(parity.get("passed"), bool):
            problems.append("parity.passed: missing or not true/false")
        if "tolerance" in parity and not (isinstance(parity["tolerance"], dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in parity["tolerance"].values())):
            problems.append("parity.tolerance: not an object of numbers")
        if not isinstance(parity.get("outputs", []), list):
            problems.append("parity.outputs: not a list")
        precision = parity.get("precision")
        if precision is not None and not (isinstance(precision, dict) and (isinstance(precision.get("mode"), str) or (
                precision.get("emulated") is False and isinstance(precision.get("reason"), str)))):
            problems.append("parity.precision: not an object with a mode (or why the emulation did not run)")
    return problems


def atc_problems(atc: Any) -> list[str]:
    """The shape of a manifest's ``atc`` section (the ATC options an export rendered)."""
    if not isinstance(atc, dict):
        return ["atc: missing or not an object"]
    problems = [f"atc.{key}: missing or not a string" for key in ("soc_version", "precision_mode")
                if not isinstance(atc.get(key), str)]
    if not isinstance(atc.get("hints", {}), dict):
        problems.append("atc.hints: not an object")
    command = atc.get("command")
    if command is not None and not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
        problems.append("atc.command: not a list of strings")
    return problems


def path_bound_problem(rel: str) -> str | None:
    """Why ``rel`` is too long to be a path in a bundle (None: it is not)."""
    if len(rel) > MAX_PATH_CHARS:
        return f"a path of {len(rel)} characters (at most {MAX_PATH_CHARS}; refused)"
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in rel.split("/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"a path component of {longest} bytes (at most {MAX_NAME_BYTES}; refused)"
    return None


def shown_path(rel: str, limit: int = 80) -> str:
    """``rel`` as a message shows it: quoted, a long one cut at ``limit`` characters with its length."""
    return repr(rel) if len(rel) <= limit else repr(rel[:limit]) + f"... ({len(rel)} characters)"


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _is_values(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value)


def unknown_names(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> list[str]:
    """The keys of ``value`` the writer does not write at ``where``."""
    return [f"{where or 'the top level'}: field {str(k)[:80]!r} is not one this tool writes there (refused)"
            for k in [k for k in value if k not in allowed][:SHOWN]]


def _dataclass_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _is_int(value: Any) -> bool:
    return type(value) is int


def section_problems(manifest: dict[str, Any]) -> list[str]:
    """One graph's top-level names and sections (its common shape, ``model``'s values and the file table, already
    passed ``graph_problems``)."""
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


# A multi-graph bundle's top level

def bundle_problems(manifest: Any) -> list[str]:
    """Everything about a multi-graph bundle's top level that differs from what its writer writes: the schema, the
    components (1..MAX_COMPONENTS, each a name, its directory and the sha256 of its one-graph manifest), the
    connections, the verdict, the file table; then every name and type (``key_problems``)."""
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        return [f"schema: not {SCHEMA}"]
    problems = []
    comps = manifest.get("components")
    if not isinstance(comps, list) or not 1 <= len(comps) <= MAX_COMPONENTS:
        return [f"components: missing or not a list of 1..{MAX_COMPONENTS} components"]
    seen = set()
    for k, c in enumerate(comps):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not NAME.fullmatch(c["name"]):
            problems.append(f"components[{k}]: no name of the form {NAME.pattern}")
            continue
        name = c["name"]
        if name in seen:
            problems.append(f"components[{k}]: {name!r} listed twice")
        seen.add(name)
        if c.get("path") != f"{COMPONENTS_DIR}/{name}":
            problems.append(f"components[{k}].path: not {COMPONENTS_DIR}/{name}")
        if not isinstance(c.get("manifest_sha256"), str):
            problems.append(f"components[{k}].manifest_sha256: missing")
        for key in ("inputs", "outputs"):
            if not isinstance(c.get(key), list) or not all(isinstance(v, str) for v in c[key]):
                problems.append(f"components[{k}].{key}: not a list of names")
    conns = manifest.get("connections")
    if not isinstance(conns, list) or len(conns) > MAX_CONNECTIONS:
        problems.append("connections: missing or not a list")
    else:
        for k, conn in enumerate(conns):
            ok = isinstance(conn, dict) and all(
                isinstance(conn.get(end), dict) and isinstance(conn[end].get("component"), str)
                and isinstance(conn[end].get(key), str) for end, key in (("from", "output"), ("to", "input")))
            if not ok:
                problems.append(f"connections[{k}]: not {{from: {{component, output}}, to: {{component, input}}}}")
    parity = manifest.get("parity")
    if not isinstance(parity, dict) or not isinstance(parity.get("passed"), bool):
        problems.append("parity.passed: missing or not true/false")
    elif not isinstance(parity.get("components", {}), dict):
        problems.append("parity.components: not a map of component name to verdict")
    for key in ("kind", "format"):
        if not isinstance(manifest.get(key), str):
            problems.append(f"{key}: missing or not a name")
    problems += _file_table_problems(manifest.get("files"))
    return problems + key_problems(manifest)


def key_problems(manifest: dict[str, Any]) -> list[str]:
    """The names and types of the top-level manifest (``components``, ``connections``, ``parity`` and ``files``
    already have their types checked by ``bundle_problems``): an allow-list at every level the writer fills."""
    problems = unknown_names(manifest, TOP_REQUIRED + TOP_OPTIONAL, "")
    problems += [f"{k}: missing" for k in ("run", "provenance") if k not in manifest]
    for k, c in enumerate(manifest["components"]):
        if isinstance(c, dict):
            problems += unknown_names(c, COMPONENT_KEYS, f"components[{k}]")
            if not isinstance(c.get("role"), str):
                problems.append(f"components[{k}].role: missing or not a name")
    wired: list[str] = []
    for k, conn in enumerate(manifest["connections"] if isinstance(manifest.get("connections"), list) else []):
        if isinstance(conn, dict):
            wired += unknown_names(conn, tuple(CONNECTION_ENDS), f"connections[{k}]")
            wired += [p for end, keys in CONNECTION_ENDS.items() if isinstance(conn.get(end), dict)
                      for p in unknown_names(conn[end], keys, f"connections[{k}].{end}")]
    problems += wired[:SHOWN]
    parity = manifest.get("parity")
    if isinstance(parity, dict):
        problems += unknown_names(parity, PARITY_KEYS, "parity")
        verdicts = parity.get("components")
        if not isinstance(verdicts, dict) or not all(v is True or v is False or v is None for v in verdicts.values()):
            problems.append("parity.components: missing or not a map of component name to true / false / null")
    files = manifest.get("files")
    if isinstance(files, dict):
        problems += [p for rel, entry in files.items() if isinstance(entry, dict)
                     for p in unknown_names(entry, FILE_KEYS, f"files[{rel[:200]!r}]")][:SHOWN]
    for key in ("run", "provenance"):
        if key in manifest and not isinstance(manifest[key], dict):
            problems.append(f"{key}: not an object")
    if "atc" in manifest:
        problems += _atc_shape(manifest["atc"])
    if "sandbox" in manifest:  # pipeline/sandboxed_directory.py's record: no torch_threads (each component has its own)
        problems += sandbox_problems(manifest["sandbox"], optional={})
    return problems


def _atc_shape(atc: Any) -> list[str]:
    if not isinstance(atc, dict):
        return [f"atc: a {type(atc).__name__}, not an object with {' and '.join(ATC_KEYS)}"]
    problems = unknown_names(atc, ATC_KEYS, "atc")
    if not isinstance(atc.get("script"), str):
        problems.append("atc.script: missing or not a path")
    if "soc_version" not in atc or not isinstance(atc["soc_version"], (str, type(None))):
        problems.append("atc.soc_version: missing or not a name")
    return problems
