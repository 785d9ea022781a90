"""What the stages before commit staged, checked again by the process that commits it (``pipeline/write_stage.commit``,
``pipeline/sandboxed_directory``). Those stages run the model's code (in the sandboxed child, or here with
--no-sandbox), which may have written anything into its staging directory; nothing of it is committed on the
child's word.
One rule for a single graph and for each graph of a multi-graph bundle (``staged_problems``):

- every entry is a plain directory or a regular file with one link: no symlink, hardlink, device, FIFO, socket;
- every file is one the format declares it writes (``Format.writes``: patterns, ``*`` within one path part,
  ``**`` for any rest);
- a bundle (a staged ``manifest.json``) is checked as ``validate`` checks it, without parity
  (``rederive.check_bundle``): the strict schema of its manifest, the file table against the files (digests),
  the graph against the manifest, atc/convert.sh and every cfg file re-rendered from the validated ATC options and
  compared byte for byte; and its file table lists exactly the staged regular files. The ATC options it was
  rendered from must be the ones this process validated (``options``);
- a loose graph (``--format onnx``) reads external data only from a declared staged file.
"""
from __future__ import annotations

import os
import stat
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..hooks.contracts import Format, optional

MAX_ENTRIES = 10_000  # files and directories walked in one staging directory
MANIFEST = "manifest.json"
FOLLOW_GRAPH = ("input_shape", "input_shape_range")  # hints a stage narrows to the graph (checked against it)
ASIDE = ".cann-tmp-"  # a declared file a format keeps out of its file table (om's model.om beside the bundle)


def shown(rel: str) -> str:
    """A staged name as a message shows it: quoted, control characters escaped, bounded."""
    return repr(rel[:120])


def carried_names() -> tuple[str, ...]:
    """The files a loader may carry into a bundle (hf/: a model directory's allow-listed companions)."""
    from ..hf.directory_files import BUNDLE_FOLDER, COMPANIONS

    return tuple(f"{BUNDLE_FOLDER}/{name}" for name in COMPANIONS)


def matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether the relative path ``rel`` is one of ``patterns`` (``*`` never crosses a ``/``; a ``**`` part
    matches every rest)."""
    parts = rel.split("/")
    for pattern in patterns:
        want = pattern.split("/")
        if "**" in want:
            at = want.index("**")
            if len(parts) > at and all(fnmatchcase(p, w) for p, w in zip(parts[:at], want[:at], strict=True)):
                return True
        elif len(want) == len(parts) and all(fnmatchcase(p, w) for p, w in zip(parts, want, strict=True)):
            return True
    return False


def _folders(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The directories the declared files may lie in (each folder part of each pattern)."""
    found = []
    for pattern in patterns:
        parts = pattern.split("/")
        for k in range(1, len(parts)):
            found.append("/".join(parts[:k]))
            if parts[k] == "**":
                found.append("/".join(parts[:k]) + "/**")
                break
    return tuple(dict.fromkeys(found))


def walk(directory: Path) -> tuple[list[str], list[str], list[str]]:
    """The regular files and the directories under ``directory`` (relative POSIX paths, sorted), and every
    entry that is neither (or a file with more than one link); links are never followed."""
    files: list[str] = []
    folders: list[str] = []
    problems: list[str] = []
    count = 0
    for root, dirs, names in os.walk(directory):  # never follows a link: a link to a directory is in ``dirs``
        for name in sorted(dirs) + sorted(names):
            count += 1
            if count > MAX_ENTRIES:
                return files, folders, problems + [f"more than {MAX_ENTRIES} entries"]
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            mode = os.lstat(path)
            if stat.S_ISLNK(mode.st_mode):
                problems.append(f"{shown(rel)}: a symbolic link")
            elif stat.S_ISDIR(mode.st_mode):
                folders.append(rel)
            elif not stat.S_ISREG(mode.st_mode):
                problems.append(f"{shown(rel)}: not a regular file (a device, FIFO or socket)")
            elif mode.st_nlink != 1:
                problems.append(f"{shown(rel)}: a hard link ({mode.st_nlink} names for one file)")
            else:
                files.append(rel)
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    return sorted(files), sorted(folders), problems


def declared(fmt: Format, output: Path) -> tuple[str, ...] | None:
    """What ``fmt`` declares an export to ``output`` stages, or None when it declares nothing."""
    writes = optional(fmt, Format, "writes")
    return tuple(writes(output)) if writes else None


def staged_problems(directory: Path, fmt: Format, output: Path,
                    options: Any = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The staged artifact's manifest (None when it has none) and every way the staged ``directory`` differs
    from what ``fmt`` writes for ``output`` (see the module docstring); ``options``: the ATC options this
    process validated, which a bundle's ATC section must hold."""
    files, folders, problems = walk(directory)
    patterns = declared(fmt, output)
    if patterns is not None:
        problems += [f"{shown(rel)}: not a file --format {fmt.name} writes" for rel in files
                     if not matches(rel, patterns)]
        problems += [f"{shown(rel)}/: not a directory --format {fmt.name} writes" for rel in folders
                     if not matches(rel, _folders(patterns))]
    if MANIFEST not in files:
        return None, problems + _graph_problems(directory, files, fmt, output)
    from .rederive import check_bundle

    try:
        checked = check_bundle(directory, raise_on_difference=False, weights=False)
    except ExportError as e:  # the manifest does not have the strict shape
        return None, problems + [f"{MANIFEST}: {e.message}"]
    manifest = checked.manifest
    listed = set(manifest["files"])
    aside = {rel for rel in files if rel.startswith(ASIDE) and patterns is not None and matches(rel, patterns)}
    problems += [f"{shown(rel)}: not in the file table of {MANIFEST}" for rel in files
                 if rel != MANIFEST and rel not in listed and rel not in aside]
    problems += checked.differences
    if options is not None:
        problems += options_problems(manifest, options)
    return manifest, problems


def _graph_problems(directory: Path, files: list[str], fmt: Format, output: Path) -> list[str]:
    """A loose graph's external data must be a staged file its format declares."""
    import onnx

    from .read import external_data_files

    graphs = [rel for rel in files if rel.endswith(".onnx")]
    patterns = declared(fmt, output) or ()
    problems = []
    for rel in graphs:
        try:
            model = onnx.load(str(directory / rel), load_external_data=False)
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
            problems.append(f"{shown(rel)}: not a readable ONNX model ({type(e).__name__})")
            continue
        problems += [f"{shown(rel)}: reads external data from {shown(location)}, not a staged file --format "
                     f"{fmt.name} writes" for location in external_data_files(model)
                     if location not in files or not matches(location, patterns)]
    return problems


def options_problems(manifest: dict[str, Any], options: Any) -> list[str]:
    """A bundle's ATC section against the options this process validated: the SoC, precision mode, hints and the
    CANN release of the dynamic form (the graph's own facts, shapes and dynamic axes, are checked by
    ``check_bundle``)."""
    import json

    from ..atc.hints import effective_precision

    atc = manifest.get("atc")
    if not isinstance(atc, dict) or not atc:
        return []
    hints = json.loads(json.dumps(dict(options.atc_hints or {}), default=str))
    recorded = atc.get("hints") if isinstance(atc.get("hints"), dict) else {}
    if set(recorded) == set(hints):  # the ranges follow the graph's fixed dims (inputs/given_shapes.py)
        hints.update({key: recorded[key] for key in FOLLOW_GRAPH if key in hints})
    expected = {"soc_version": options.soc_version, "precision_mode": effective_precision(options), "hints": hints}
    problems = [f"{MANIFEST} atc.{key}: {str(atc.get(key))[:120]!r}, not the validated option {str(value)[:120]!r}"
                for key, value in expected.items() if atc.get(key) != value]
    dynamic = atc.get("dynamic")
    if isinstance(dynamic, dict) and str(dynamic.get("cann_version")) != str(options.cann_version):
        problems.append(f"{MANIFEST} atc.dynamic.cann_version: {str(dynamic.get('cann_version'))[:40]!r}, not the "
                        f"validated option {str(options.cann_version)!r}")
    return problems
