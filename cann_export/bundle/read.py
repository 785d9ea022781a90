"""Reading existing artifacts: bundles (directories, single-file archives, or a single file a Format
unpacks, such as an om-stub) and plain .onnx files. Nothing a manifest says is trusted before it is checked:
its shape by the one schema (``manifest_schema``, through ``read_manifest``), then the format's own sections, its
claims in ``rederive``."""
from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ValidateError
from ..fs import digests
from ..fs.atomic import is_safe_relpath
from ..fs.regular import check_regular_file
from ..hooks.contracts import Container, Format, optional
from . import single_file
from .manifest_schema import graph_problems, manifest_problems, path_bound_problem, shown_path

# Bounds on what a manifest may hold, checked before anything in it touches the disk or the parser's stack
# (an export writes far less: a few KiB of JSON nested about 6 deep, paths well under 100 characters).
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64


def read_bundle(path: Path) -> dict[str, Any]:
    """The manifest of a bundle directory, after checking that it has the shape this tool writes
    (a malformed manifest is a refusal naming every problem, never a KeyError later on)."""
    if not path.exists():
        raise ValidateError("bundle not found; pass the directory a bundle export (e.g. --format atc_ready) wrote",
                            path=path)
    manifest_path = path / "manifest.json"
    if not path.is_dir() or not manifest_path.is_file():
        raise ValidateError("not a cann-export bundle (no manifest.json); pass the directory a bundle export "
                            "(e.g. --format atc_ready) wrote", path=path)
    manifest, problems = read_manifest(manifest_path, several=False)
    if not problems:
        fmt = format_of(manifest, manifest_path)
        own = optional(fmt, Format, "manifest_problems")
        problems = own(manifest) if own else []
        if not fmt.is_directory:
            problems.append(f"format: {manifest['format']!r} writes a single file, not a bundle directory")
    if problems:
        shown = problems[:20] + ([f"... {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise ValidateError("manifest.json is malformed: " + "; ".join(shown)
                            + ". The bundle is damaged or was edited; export it again", path=manifest_path)
    return manifest


def read_manifest(manifest_path: Path, several: bool) -> tuple[Any, list[str]]:
    """The one reader entry of a manifest.json, one graph's or a multi-graph bundle's top level (``several``):
    parsed within bounds (``load_manifest_file``), then every difference from the one schema named
    (``manifest_schema.manifest_problems``; the caller refuses a manifest with any, in its own words)."""
    manifest = load_manifest_file(manifest_path)
    return manifest, manifest_problems(manifest, several)


def load_manifest_file(manifest_path: Path) -> Any:
    """Parse ``manifest.json`` within bounds: at most ``MAX_MANIFEST_BYTES`` (read no further), JSON nested at
    most ``MAX_JSON_DEPTH`` deep; a file past either is a clean refusal, never a MemoryError or RecursionError."""
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ValidateError(f"cannot read manifest.json ({e.strerror or e}); check the bundle's permissions",
                            path=manifest_path) from e
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValidateError(f"manifest.json is larger than {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB (an export writes "
                            "a few KiB); the bundle is damaged or was edited, export it again", path=manifest_path)
    from ..fs.jsonio import loads_strict

    try:  # strict: NaN / Infinity or a key twice (which Python's parser takes, keeping the last) an export never writes
        manifest = loads_strict(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, and an int past Python's digit limit
        raise ValidateError(f"manifest.json is not valid JSON ({e}); the bundle is damaged or was edited, export "
                            "it again", path=manifest_path) from e
    except RecursionError as e:
        manifest = e
    if isinstance(manifest, RecursionError) or json_depth(manifest) > MAX_JSON_DEPTH:
        raise ValidateError(f"manifest.json nests deeper than {MAX_JSON_DEPTH} levels (an export writes under 10); "
                            "the bundle is damaged or was edited, export it again", path=manifest_path)
    return manifest


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def external_data_files(model: Any) -> list[str]:
    """The files the graph's external-data initializers name (each ``location`` as written)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    found = []
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            found.append(location)
    return list(dict.fromkeys(found))


def emulation_skipped(parity: dict[str, Any], model: Any, path: Any) -> bool:
    """Whether the export skipped the device emulation for a large graph (capture/large_graph.py: its weights in
    an external-data file, no device verdict anywhere); a manifest that says so otherwise was edited."""
    if (parity.get("precision") or {}).get("emulated") is not False:
        return False
    device = parity.get("device") is not None or "graph_fp32_passed" in parity or any(
        isinstance(row, dict) and "device" in row for row in parity.get("shapes") or [])
    if device or not (model is not None and external_data_files(model)):
        raise ValidateError("manifest.json's parity.precision says the device emulation was skipped (as for a "
                            "graph past external_data_threshold), but the bundle has "
                            + ("a device verdict" if device else "no external-data weights")
                            + "; the bundle was changed after export, export it again", path=path)
    return True


def format_of(manifest: dict[str, Any], path: Path | None = None) -> Format:
    """The registered Format the manifest names; a format no loaded plugin registers is a refusal naming
    it (the plugin that wrote the bundle is missing), never a guess."""
    from ..hooks.manager import registry

    formats = registry().formats()
    name = manifest["format"]
    if name not in formats:
        raise ValidateError(f"the manifest names format {name!r}, which no loaded plugin registers (known: "
                            f"{', '.join(sorted(formats))}); install the plugin that provides {name!r} (and allow it "
                            "in CANN_EXPORT_LOAD_PLUGINS if that is set), then run again", path=path)
    return formats[name]


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file listed in the manifest exists with its recorded size and sha256; collect all problems."""
    problems = file_problems(path, manifest)
    if problems:
        raise ValidateError("bundle files do not match the manifest: " + "; ".join(problems)
                            + ". Re-export or restore the bundle", path=path)


def file_problems(path: Path, manifest: dict[str, Any]) -> list[str]:
    """The file table checked against the directory; every path is validated before it touches the disk."""
    problems = []
    files = manifest.get("files")
    if not isinstance(files, dict):
        return ["the manifest lists no valid file table"]
    root = path.resolve()
    for rel, entry in files.items():
        if not isinstance(rel, str) or not is_safe_relpath(rel):
            problems.append(f"{shown_path(rel) if isinstance(rel, str) else repr(rel)}: not a path inside the bundle "
                            "(refused)")
            continue
        bound = path_bound_problem(rel)
        if bound:
            problems.append(f"{shown_path(rel)}: {bound}")
            continue
        if not isinstance(entry, dict) or not digests.is_sha256(entry.get("sha256")):
            problems.append(f"{rel}: malformed file-table entry")
            continue
        f = path / rel
        if f.is_symlink() or (f.exists() and not f.resolve().is_relative_to(root)):
            problems.append(f"{rel}: a link out of the bundle (refused)")
        elif not f.is_file():
            problems.append(f"{rel}: missing")
        elif f.stat().st_size != entry.get("size") or digests.sha256_file(f) != entry["sha256"]:
            problems.append(f"{rel}: contents changed (sha256 mismatch)")
    model_file = (manifest.get("model") or {}).get("file")
    if isinstance(model_file, str) and model_file not in files:
        problems.append(f"{model_file}: the graph is not in the file table")
    return problems


def manifest_sha256(directory: Path) -> str | None:
    f = directory / "manifest.json"
    return digests.sha256_file(f) if f.is_file() else None


@contextlib.contextmanager
def open_bundle(path: Path) -> Iterator[tuple[Path, Container | None]]:
    """Yield ``(bundle directory, container)`` for ``path``: a directory as is; a single file a Format's
    ``unpack`` claims (an om-stub), or a single-file bundle (``x.pth`` / ``x.zip``), unpacked with bounded
    reads into a temporary directory (removed afterwards). Any other file is yielded unchanged. The container
    names the Format that unpacked the file and its header. Errors name ``path``, not the temporary directory."""
    path = Path(path)
    if path.exists() and not path.is_dir():  # a FIFO would block inspect's read, /dev/zero never end it
        check_regular_file(path, "artifact", "Pass a bundle directory, a single-file bundle, an om-stub or an "
                           ".onnx file", ValidateError)
    if not path.is_file():
        if (path / "manifest.json").is_file():  # a bundle directory: the same rule as an unpacked one
            _refuse_unlisted(path, path, "bundle directory", unlisted_entries(path, single_graph=True))
        yield path, None
        return
    with tempfile.TemporaryDirectory(prefix="cann-export-unpacked-") as tmp:
        directory = Path(tmp)
        container = _unpack(path, directory)
        if container is None:
            if not single_file.is_bundle_archive(path):
                yield path, None
                return
            single_file.extract_archive(path, directory)
        _refuse_unlisted(path, directory, "om-stub payload" if container else "single-file bundle",
                         unlisted_entries(directory))
        try:
            yield directory, container
        except ValidateError as e:
            if e.path and e.path.startswith(str(directory)):
                e.path = str(path) + e.path[len(str(directory)):]
            raise


def _refuse_unlisted(path: Path, directory: Path, what: str, unlisted: list[str]) -> None:
    if unlisted:
        shown = ", ".join(shown_path(rel) for rel in unlisted[:10]) + (f" (+{len(unlisted) - 10} more)"
                                                                   if len(unlisted) > 10 else "")
        raise ValidateError(f"the {what} holds {shown}, which its manifest's file table does not list; an export "
                            "lists every file it writes, so the file was added or edited: refusing it. Export it "
                            "again", path=path)


def unlisted_entries(directory: Path, single_graph: bool = False) -> list[str]:
    """The files of an unpacked bundle that its manifest's file table does not list (manifest.json aside).
    A manifest that cannot be read or has no file table lists nothing here: ``read_bundle`` names why.
    ``single_graph``: only for a well-formed single graph's manifest (a multi-graph bundle's own check names each
    file in its terms; a malformed manifest is refused for that first)."""
    try:
        manifest = load_manifest_file(directory / "manifest.json")
    except ValidateError:
        return []
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return []
    if single_graph and ("components" in manifest or graph_problems(manifest)):
        return []
    found = (p.relative_to(directory).as_posix() for p in sorted(directory.rglob("*"))
             if p.is_symlink() or not p.is_dir())  # a link (to a directory too) is never what an export writes
    return [rel for rel in found if rel != "manifest.json" and rel not in files]


def _unpack(path: Path, directory: Path) -> Container | None:
    from ..hooks.manager import registry

    for fmt in registry().formats().values():
        unpack = optional(fmt, Format, "unpack")
        header = unpack(path, directory) if unpack else None
        if header is not None:
            return Container(format=fmt.name, header=header)
    return None


@contextlib.contextmanager
def open_artifact(path: Path) -> Iterator[Path]:
    """The bundle directory of ``path`` (see ``open_bundle``), without its container."""
    with open_bundle(path) as (directory, _):
        yield directory
