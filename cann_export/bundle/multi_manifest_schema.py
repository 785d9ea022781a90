"""The top-level manifest.json of a multi-graph bundle, field by field, against what its writer
(``bundle.multi_write.build_manifest``, then ``export_plan``'s ``sandbox`` record) can have produced: strict JSON
(RFC 8259: no NaN / Infinity, no key twice in one object), an allow-list of names at every level the writer
fills, each value's type; then every value that can be re-derived, re-derived: ``atc`` (present exactly when the
components are headed for ATC: the script path this tool writes and the first component's soc_version),
``provenance`` (the first component's), each component's input and output names in its graph's order, the
parity map's names, the file table's paths (the components', ``atc/convert.sh`` and a model directory's
carried ``hf/`` files), ``sandbox`` in one of the shapes ``pipeline/sandboxed_directory.py`` records,
present exactly when the bundle carries a model directory's files, and ``precision_fix`` (``multi_precision.py``)
from the components' own --fix-precision records. Each difference is a string naming the field."""
from __future__ import annotations

from typing import Any

from .manifest_schema import SHOWN, sandbox_problems, unknown_names
from .multi_write import COMPONENTS_DIR, CONVERT, atc_headed, component_format

TOP_REQUIRED = ("schema", "format", "kind", "components", "connections", "run", "parity", "provenance", "files")
TOP_OPTIONAL = ("atc", "sandbox", "pipeline", "precision_fix")  # pipeline: a diffusers pipeline's (diffusion/check.py)
COMPONENT_KEYS = ("name", "role", "path", "manifest_sha256", "inputs", "outputs")
CONNECTION_ENDS = {"from": ("component", "output"), "to": ("component", "input")}
PARITY_KEYS = ("passed", "components")
ATC_KEYS = ("script", "soc_version")
FILE_KEYS = ("sha256", "size")
CARRIED_DIR = "hf"  # a model directory's config and tokenizer files (hf.files.companions)


def key_problems(manifest: dict[str, Any]) -> list[str]:
    """The names and types of the top-level manifest (``components``, ``connections``, ``parity`` and ``files``
    already have their types checked by ``check.shape_problems``): an allow-list at every level the writer fills."""
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


def field_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]]) -> list[str]:
    """The values re-derived from the components' own manifests (``owns``: the readable ones, by name; their
    sha256 checked against the manifest's) and the component names, against the manifest's (see the module
    docstring)."""
    names = [c["name"] for c in manifest["components"]]
    first = owns.get(names[0])
    diffs = _atc_values(manifest, first, names[0])
    if first is not None:
        own = first.get("provenance") if isinstance(first.get("provenance"), dict) else {}
        if manifest.get("provenance") != own:
            keys = sorted(set(own) ^ set(manifest["provenance"]) | {k for k in own if own[k] !=
                                                                     manifest["provenance"].get(k)})
            diffs.append(f"manifest.json provenance: not the first component's ({COMPONENTS_DIR}/{names[0]}/"
                         f"manifest.json; differing: {', '.join(k[:40] for k in keys[:5])})")
    for c in manifest["components"]:
        own = owns.get(c["name"])
        for key in ("inputs", "outputs") if own is not None else ():
            if c[key] != [v["name"] for v in own["model"][key]]:
                diffs.append(f"manifest.json components[{c['name']}].{key}: not the names of "
                             f"{c['path']}/manifest.json in its order")
    recorded = sorted(map(str, manifest["parity"]["components"]))
    if recorded != sorted(names):
        diffs.append(f"manifest.json parity.components: names {', '.join(n[:40] for n in recorded[:SHOWN])}, not "
                     f"the components {', '.join(names)}")
    if len(owns) == len(names):  # --fix-precision's summary, from every component's own record
        from .multi_precision import fix_problems

        diffs += fix_problems(manifest, owns)
    return diffs + _file_paths(manifest, names) + _sandbox_presence(manifest)


def _atc_values(manifest: dict[str, Any], first: dict[str, Any] | None, name: str) -> list[str]:
    """``atc``: written exactly when the components are headed for ATC (then ``atc/convert.sh`` is too), naming
    that script and the first component's soc_version."""
    fmt = component_format(manifest.get("format"))
    if fmt is None:
        return []  # check.format_problems names the format
    if "atc" not in manifest:
        return [f"manifest.json atc: missing (a --format {manifest['format']} bundle records its ATC script and "
                "soc_version)"] if atc_headed(fmt) else []
    if not atc_headed(fmt):
        return [f"manifest.json atc: a --format {manifest['format']} bundle has no ATC section (its graphs are "
                "not headed for ATC)"]
    atc, diffs = manifest["atc"], []
    if atc.get("script") != CONVERT:
        diffs.append(f"manifest.json atc.script: {str(atc.get('script'))[:80]!r} is not {CONVERT} (the script "
                     "this tool writes)")
    if first is not None:
        own = (first.get("atc") or {}).get("soc_version") if isinstance(first.get("atc"), dict) else None
        if atc.get("soc_version") != own:
            diffs.append(f"manifest.json atc.soc_version: {str(atc.get('soc_version'))[:80]!r} is not the "
                         f"components' {own!r} ({COMPONENTS_DIR}/{name}/manifest.json)")
    return diffs


def _file_paths(manifest: dict[str, Any], names: list[str]) -> list[str]:
    """Every path of the file table is one the writer puts there: inside a listed component, the top-level ATC
    script, or a carried companion file of a model directory."""
    from ..hf.directory_files import COMPANIONS
    from ..plan import carried_file

    allowed = {CONVERT, *(f"{CARRIED_DIR}/{n}" for n in COMPANIONS)}
    kind = manifest.get("kind")  # a pipeline's pipeline/ files: its kind's checker names each (plan.CHECKERS)
    stray = [rel for rel in manifest["files"] if rel not in allowed and not carried_file(kind, rel)
             and not any(rel.startswith(f"{COMPONENTS_DIR}/{n}/") for n in names)]
    return [f"manifest.json files[{rel[:200]!r}]: not a file a multi-graph export writes (refused)"
            for rel in stray[:SHOWN]]


def _sandbox_presence(manifest: dict[str, Any]) -> list[str]:
    """``sandbox`` is recorded exactly for an export of a model directory, which carries its config.json (and
    tokenizer files) under ``hf/``; an in-memory model's export has neither."""
    if "pipeline" in manifest:  # a pipeline's directory or object: its sandbox record is optional
        return []
    carried = any(rel.startswith(f"{CARRIED_DIR}/") for rel in manifest["files"])
    if carried and "sandbox" not in manifest:
        return [f"manifest.json sandbox: missing (the bundle carries a model directory's files, {CARRIED_DIR}/: "
                "its load is recorded)"]
    if not carried and "sandbox" in manifest:
        return [f"manifest.json sandbox: recorded, but the bundle carries no model directory's files "
                f"({CARRIED_DIR}/): an in-memory model's export records no load sandbox"]
    return []
