"""Reading a multi-graph bundle back: its top-level manifest read against the one schema (bounded, strict JSON,
allow-listed names and types: ``manifest_schema.bundle_problems``), the file table, each component's manifest
against the sha256 recorded for it and the one-graph schema, every connection against the graphs' real input and
output names, every value of the top level that can be re-derived re-derived (``field_problems``: ``atc``,
``provenance``, each component's input and output names in its graph's order, the parity map's names, the file
table's paths, ``sandbox`` in one of the shapes ``pipeline/sandboxed_directory.py`` records, present exactly when
the bundle carries a model directory's files, and ``precision_fix`` from the components' own --fix-precision
records), and the top-level ATC script re-rendered; then every component is validated (re-derived) by the
single-graph ``validate``. Any difference is a refusal (exit 2) naming the file."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .manifest_schema import MAX_COMPONENTS, SHOWN, graph_problems
from .read import load_manifest_file, read_manifest
from ..errors import ValidateError
from .multi_write import COMPONENTS_DIR, CONVERT, SCHEMA, atc_headed, component_format, convert_script
from ..plan import KINDS, checker, run_notes, wiring, wiring_source

MAX_ENTRIES = 10_000  # files and directories walked in the bundle
CARRIED_DIR = "hf"  # a model directory's config and tokenizer files (hf.files.companions)


def archive_is_multi(path: Path) -> bool:
    """Whether ``path`` is a single-file bundle (``x.zip``) whose root manifest.json names the multi-graph schema
    (its first 4 KiB read; nothing unpacked)."""
    import zipfile

    from ..bundle import single_file
    from ..load.archives import ZIP_READ_ERRORS

    path = Path(path)
    if path.suffix.lower() not in single_file.ARCHIVE_SUFFIXES or not single_file.is_bundle_archive(path):
        return False  # a multi-graph bundle is never an om-stub
    try:
        with zipfile.ZipFile(path) as zf:
            single_file.check_members(zf, path.stat().st_size, path, "the bundle archive")  # before any read
            with zf.open("manifest.json") as f:
                return SCHEMA.encode() in f.read(4096)
    except (*ZIP_READ_ERRORS, ValidateError):
        return False  # the single-file reader names what is wrong with it


@contextlib.contextmanager
def opened_multi(path: Path) -> Iterator[Path | None]:
    """The multi-graph bundle directory of ``path``: a directory as is, a single-file bundle unpacked with bounded
    reads (``bundle.read.open_bundle``, removed afterwards); None when ``path`` holds no multi-graph bundle."""
    from ..bundle.read import open_bundle

    path = Path(path)
    if not archive_is_multi(path):
        yield path if is_multi(path) else None
        return
    with open_bundle(path) as (directory, _):
        yield directory if is_multi(directory) else None


def is_multi(directory: Path) -> bool:
    """Whether ``directory`` holds a multi-graph bundle (its manifest.json names this schema)."""
    import json

    f = Path(directory) / "manifest.json"
    if not Path(directory).is_dir() or not f.is_file() or f.is_symlink():
        return False
    try:
        with open(f, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if SCHEMA.encode() not in head:
        return False
    try:
        data = load_manifest_file(f)
    except (ValidateError, json.JSONDecodeError):
        return True  # claims the schema: read_multi names why it cannot be read
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def read_multi(directory: Path) -> dict[str, Any]:
    """The top-level manifest (strict JSON) after it is checked against the one schema (every problem named)."""
    path = Path(directory) / "manifest.json"
    manifest, problems = read_manifest(path, several=True)
    if problems:
        raise ValidateError("manifest.json of the multi-graph bundle is malformed: " + "; ".join(problems[:20])
                            + ". The bundle is damaged or was edited; export it again", path=path)
    return manifest


def check_multi(directory: Path) -> tuple[dict[str, Any], list[str]]:
    """The manifest and every difference between it and the bundle (files, component manifests, connections,
    the ATC script); the components' own contents are checked by their validate."""
    from .read import file_problems

    directory = Path(directory)
    manifest = read_multi(directory)
    diffs = file_problems(directory, manifest)
    diffs += placement_problems(directory, manifest["files"])
    listed = {c["name"] for c in manifest["components"]}
    if (directory / COMPONENTS_DIR).is_dir() and not (directory / COMPONENTS_DIR).is_symlink():
        diffs += [f"{COMPONENTS_DIR}/{p.name[:80]}: not a component of manifest.json (refused)"
                  for p in sorted((directory / COMPONENTS_DIR).iterdir())[:MAX_COMPONENTS + 1] if p.name not in listed]
    names: dict[str, dict[str, set[str]]] = {}
    owns: dict[str, dict[str, Any]] = {}
    verdicts: list[bool] = []
    for c in manifest["components"]:
        own, problems = _component_manifest(directory, c)
        diffs += problems
        if own is None:
            continue
        model = own["model"]
        real = {"inputs": {v["name"] for v in model["inputs"]}, "outputs": {v["name"] for v in model["outputs"]}}
        names[c["name"]], owns[c["name"]] = real, own
        recorded = (manifest["parity"].get("components") or {}).get(c["name"])
        own_passed = (own.get("parity") or {}).get("passed") if isinstance(own.get("parity"), dict) else None
        if recorded is not own_passed:
            diffs.append(f"manifest.json parity.components.{c['name']}: records {recorded!r}, "
                         f"{c['path']}/manifest.json records {own_passed!r}")
        verdicts.append(own_passed is True)
        for key in ("inputs", "outputs"):
            if set(c[key]) != real[key]:
                diffs.append(f"manifest.json components[{c['name']}].{key}: differ from {c['path']}/manifest.json")
    whole = len(owns) == len(manifest["components"])
    wired = connection_problems(manifest, names) + (wiring_problems(manifest, owns) if whole else [])
    diffs += wired
    if whole and not wired:  # the shape check follows the connections: only the plan's own (no loops)
        from .graph_shape_check import component_shape_problems

        diffs += [d for n, own in owns.items() for d in component_shape_problems(n, own, owns, _feeding(manifest))]
    if len(verdicts) == len(manifest["components"]) and manifest["parity"]["passed"] is not all(verdicts):
        diffs.append(f"manifest.json parity.passed: records {manifest['parity']['passed']}, its components "
                     f"{'all' if all(verdicts) else 'do not all'} pass")
    diffs += format_problems(manifest, owns) + field_problems(manifest, owns)
    diffs += script_problems(directory, manifest)
    return manifest, diffs



def _component_manifest(directory: Path, c: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """Component ``c``'s own manifest (None where it cannot be used) and the differences found reading it: a
    directory inside the bundle, its manifest.json with the sha256 the top level records, and one graph's manifest
    by the one schema (``manifest_schema.graph_problems``)."""
    from ..fs import digests

    home = directory / c["path"]
    if home.is_symlink() or (directory / COMPONENTS_DIR).is_symlink():
        return None, [f"{c['path']}: a link, not a directory inside the bundle (refused)"]
    f = home / "manifest.json"
    if f.is_symlink() or not f.is_file():
        return None, [f"{c['path']}/manifest.json: missing (component {c['name']!r})"]
    diffs = []
    if digests.sha256_file(f) != c["manifest_sha256"]:
        diffs.append(f"{c['path']}/manifest.json: sha256 differs from the one recorded for component "
                     f"{c['name']!r} (the component was changed)")
    try:
        own = load_manifest_file(f)
    except ValidateError as e:
        return None, diffs + [f"{c['path']}/manifest.json: unreadable ({e})"]
    wrong = graph_problems(own)  # each component is one graph's bundle
    if wrong:
        return None, diffs + [f"{c['path']}/manifest.json: not one graph's manifest ({'; '.join(wrong[:3])})"]
    return own, diffs


def format_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]]) -> list[str]:
    """The top-level format holds multi-graph bundles, and every component is written in the format it declares
    for them (which says whether the bundle has an ATC script)."""
    inner = component_format(manifest.get("format"))
    if inner is None:
        return [f"manifest.json format: {str(manifest.get('format'))[:80]!r} is not a format of multi-graph bundles "
                "(or the plugin that wrote it is not loaded)"]
    return [f"{COMPONENTS_DIR}/{name}/manifest.json format: {str(own.get('format'))[:80]!r}, not {inner.name!r} "
            f"(the components of a {manifest['format']} bundle)" for name, own in owns.items()
            if own.get("format") != inner.name]


def connection_problems(manifest: dict[str, Any], names: dict[str, dict[str, set[str]]]) -> list[str]:
    """Each connection's ends name a component of the manifest and an input / output that component has."""
    diffs = []
    for k, conn in enumerate(manifest["connections"]):
        for end, key, kind in (("from", "output", "outputs"), ("to", "input", "inputs")):
            comp, value = conn[end]["component"], conn[end][key]
            if comp not in {c["name"] for c in manifest["components"]}:
                diffs.append(f"manifest.json connections[{k}].{end}: unknown component {comp[:80]!r}")
            elif comp in names and value not in names[comp][kind]:
                diffs.append(f"manifest.json connections[{k}].{end}: component {comp!r} has no {key} {value[:80]!r}")
    return diffs


def script_problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """atc/convert.sh is the script this tool renders for the components, and listed in the file table (a bundle
    whose components are not headed for ATC has none)."""
    diffs = []
    script = directory / CONVERT
    if not atc_headed(component_format(manifest.get("format"))):
        there = script.exists() or script.is_symlink() or CONVERT in manifest["files"]
        return [f"{CONVERT}: a --format {str(manifest.get('format'))[:40]} bundle has no ATC script"] if there else []
    expected = convert_script([c["name"] for c in manifest["components"]])
    try:
        actual = script.read_text(encoding="utf-8") if script.is_file() and not script.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        actual = None
    if actual != expected:
        diffs.append(f"{CONVERT}: not the script this tool renders for components "
                     f"{', '.join(c['name'] for c in manifest['components'])}")
    if CONVERT not in manifest["files"]:
        diffs.append(f"{CONVERT}: not in the file table")
    return diffs


def placement_problems(directory: Path, files: dict[str, Any]) -> list[str]:
    """Everything in the bundle (manifest.json aside) must be a plain directory or a regular file inside it, and
    every file listed (with its digest) in the top-level file table: an unlisted ``hf/extra.sh`` would pass
    validate and be dropped by the zoo, an ``hf/config.json`` taken out of the table would go unchecked. A listed
    file that is missing is named by ``file_problems``."""
    import os

    if (directory / COMPONENTS_DIR).is_symlink():
        return [f"{COMPONENTS_DIR}: a link, not a directory inside the bundle (refused)"]
    problems, count = [], 0
    for root, dirs, names in os.walk(directory):  # never follows a link
        for name in sorted(dirs) + sorted(names):
            count += 1
            if count > MAX_ENTRIES:
                return problems + [f"the bundle: more than {MAX_ENTRIES} entries (refused)"]
            p = Path(root) / name
            rel = p.relative_to(directory).as_posix()
            if ".cann-tmp-" in rel or rel == "manifest.json" or rel == COMPONENTS_DIR:
                continue
            where = "a component" if rel.startswith(f"{COMPONENTS_DIR}/") else "the bundle"
            if p.is_symlink():
                problems.append(f"{rel[:200]}: a link inside {where} (refused)")
            elif name in names and not p.is_file():
                problems.append(f"{rel[:200]}: not a regular file (refused)")
            elif name in names and rel not in files:
                problems.append(f"{rel[:200]}: not in the top-level file table of manifest.json")
    return problems


def _feeding(manifest: dict[str, Any]) -> list[Any]:
    """The connections that feed a graph's parity sets: none for a kind with its own checker (a pipeline connects
    its graphs through the host: scheduler, guidance; its planner's Plan.connections is empty)."""
    return [] if checker(manifest.get("kind")) is not None else manifest["connections"]


def wiring_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]]) -> list[str]:
    """The components (names, roles), connections and run notes re-derived from ``kind`` and the graphs'
    output names (``plan.wiring``, the rule export wrote them with), against the manifest's."""
    kind = manifest.get("kind")
    if (own_rule := checker(kind)) is not None:  # a diffusers pipeline: its own table re-derives it
        return own_rule.wiring_problems(manifest, owns)
    if kind not in KINDS:
        return [f"manifest.json kind: {str(kind)[:80]!r} is not one of {', '.join(KINDS)}"]
    recorded = [(c["name"], c.get("role")) for c in manifest["components"]]
    if recorded != [(n, n) for n in KINDS[kind]]:
        return [f"manifest.json components: {[n for n, _ in recorded]} with roles {[r for _, r in recorded]} are "
                f"not those of a {kind} bundle ({', '.join(KINDS[kind])}, each its own role)"]
    first = wiring_source(kind)
    expected = sorted(wiring(kind, [v["name"] for v in owns[first]["model"]["outputs"]]))
    actual = sorted((c["from"]["component"], c["from"]["output"], c["to"]["component"], c["to"]["input"])
                    for c in manifest["connections"])
    problems = []
    if actual != expected:
        wrong = sorted(set(actual) ^ set(expected))[:3]
        problems.append(f"manifest.json connections: not the {len(expected)} that a {kind} bundle's graphs give "
                        f"({len(actual)} recorded; differing: {', '.join(map(str, wrong)) or 'duplicates'})")
    length, batch = None, 1
    if kind == "decoder-with-static-cache":
        shapes = {v["name"]: v.get("shape") for v in owns["decode"]["model"]["inputs"]}
        shape = shapes.get("past_key_values.0.key")
        length = shape[2] if isinstance(shape, list) and len(shape) == 4 else None
        batch = shape[0] if length is not None and isinstance(shape[0], int) else 1
    if manifest.get("run") != run_notes(kind, length, batch, _decode_tokens(kind, owns)):
        problems.append(f"manifest.json run: not the run notes of a {kind} bundle "
                        f"{'with ' + str(length) + ' cache slots ' if length is not None else ''}"
                        "(re-derived from its graphs)")
    return problems


def _decode_tokens(kind: str, owns: dict[str, dict[str, Any]]) -> int:
    """The new tokens the loop graph of a growing-cache bundle takes: its ``input_ids``' fixed length (1 when that
    axis is symbolic or the kind has no such graph)."""
    loop = {"decoder-with-past": "decode", "encoder-decoder-with-past": "decoder_with_past"}.get(kind)
    inputs = owns[loop]["model"]["inputs"] if loop in owns else []
    shape = next((v.get("shape") for v in inputs if v.get("name") == "input_ids"), None)
    length = shape[1] if isinstance(shape, list) and len(shape) == 2 else 1
    return length if type(length) is int and length > 1 else 1


def validate_multi(directory: Path, path: Path, validate_one: Any, **validate_options: Any) -> dict[str, Any]:
    """Check the bundle (``check_multi``), then validate every component with ``validate_one`` (api.validate);
    the verdict is passed only when every component's re-derived parity passed."""
    from ..bundle.rederive import BundleMismatchError
    from ..bundle.read import manifest_sha256

    manifest, diffs = check_multi(directory)
    if diffs:
        raise BundleMismatchError(diffs, path=path)
    reports = {}
    for c in manifest["components"]:
        try:
            reports[c["name"]] = validate_one(directory / c["path"], **validate_options)
        except ValidateError as e:
            e.args = (f"component {c['name']!r}: {e.args[0] if e.args else e}",)
            raise
    whole = (manifest.get("pipeline") or {}).get("end_to_end")  # a pipeline's recorded end-to-end check (diffusion/)
    passed = all(r["passed"] for r in reports.values()) and (whole or {}).get("passed") is not False
    return {"passed": passed, "kind": manifest.get("kind"), "components": reports,
            "connections": len(manifest["connections"]), "manifest_sha256": manifest_sha256(directory),
            **({"end_to_end": whole} if whole is not None else {})}


def describe_multi(directory: Path, inspect_one: Any, shown: Path | None = None) -> dict[str, Any]:
    """What ``inspect`` shows: the components (each as ``inspect_one``, api.inspect, shows a bundle),
    connections and verdict. ``shown``: the path the user gave (a single-file bundle unpacked into ``directory``)."""
    from ..bundle.rederive import BundleMismatchError
    from ..bundle.read import manifest_sha256

    shown = Path(shown or directory)
    manifest, diffs = check_multi(directory)
    if diffs:
        raise BundleMismatchError(diffs, path=shown, stage="inspect")
    return {"kind": "multi-graph", "schema": SCHEMA, "format": manifest.get("format"),
            "bundle_kind": manifest.get("kind"),
            "components": {c["name"]: {"role": c.get("role"), **inspect_one(directory / c["path"]),
                                       "path": str(shown / c["path"])}
                           for c in manifest["components"]},
            "connections": manifest["connections"], "run": manifest.get("run", {}), "parity": manifest["parity"],
            "manifest_sha256": manifest_sha256(directory), "files": sorted(manifest["files"]),
            "size_bytes": (directory / "manifest.json").stat().st_size + sum(
                int(f.get("size") or 0) for f in manifest["files"].values() if isinstance(f, dict)),
            "atc_script": (manifest.get("atc") or {}).get("script"),
            **({"pipeline": manifest["pipeline"]} if "pipeline" in manifest else {}),
            **({"precision_fix": manifest["precision_fix"]} if "precision_fix" in manifest else {})}


def convert_multi(path: Path, output: str | Path | None, soc_version: str | None, overwrite: bool,
                  convert_one: Any, shown: Path | None = None) -> dict[str, Any]:
    """``cann-export convert`` of a multi-graph bundle: one ATC run per graph (each the single-graph
    ``convert`` of its component, which re-derives the command from the validated options), every ``.om``
    (``<component>.om`` and its ``.atc.log``) in one output directory committed at once. ``convert_one``:
    bundle.om's single-graph convert; ``shown``: the path the user gave (a single-file bundle unpacked into
    ``path``), which names the default output (``<bundle>_om`` beside it)."""
    from ..bundle.rederive import BundleMismatchError
    from ..fs import atomic

    from ..errors import OptionsError

    path = Path(path)
    shown = Path(shown or path)
    manifest, diffs = check_multi(path)
    if diffs:
        raise BundleMismatchError(diffs, path=shown, stage="convert")
    if not atc_headed(component_format(manifest.get("format"))):
        raise OptionsError(f"{shown} is a --format {manifest.get('format')} multi-graph bundle: its graphs carry no "
                           "ATC options to convert with; export the model again with --format atc_ready, then "
                           "convert that bundle", path=shown)
    out = Path(output) if output else shown.with_name(f"{shown.stem if shown.is_file() else shown.name}_om")
    atomic.check_target(out, overwrite)
    staging = atomic.staging_dir(out)
    results = {}
    try:
        for c in manifest["components"]:
            results[c["name"]] = convert_one(path / c["path"], staging / f"{c['name']}.om", soc_version, False)
        atomic.commit_dir(staging, out, overwrite)
        staging = None
    finally:
        if staging is not None:
            atomic.discard(staging)
    for name, r in results.items():  # the paths where they now are
        r["output"], r["log"] = str(out / f"{name}.om"), str(out / f"{name}.atc.log")
    first = next(iter(results.values()))
    return {"ok": True, "input": str(shown), "output": str(out), "soc_version": first["soc_version"],
            "log": ", ".join(r["log"] for r in results.values()), "components": results}


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
