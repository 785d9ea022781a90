"""What an export (or a zoo pull) may replace: only an artifact cann-export wrote, never a user's directory,
the current directory or its parents, the model's own source, or a zoo root."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import WriteError

MANIFEST = "manifest.json"
ZOO_INDEX = "index.sqlite"
ONNX_TOOL_KEY = "cann_export.tool"
_OM_MAGIC = 0x444F4D49  # ATC's MODEL_FILE_MAGIC_NUM ("IMOD" on disk), see om_stub.py
_OM_HEAD = 256
_LITTER = (".cann-tmp-", ".cann-old-", ".cann-lock")
_MAX_SCAN = 64 << 20  # bytes of an .onnx read to find its metadata (the graph field is skipped, not read)


def _fix(path: Path) -> str:
    return (f"{path} was not written by cann-export (or holds files it did not write), so --overwrite will not "
            "replace it; choose a new output path, or move it away yourself")


def check_name(target: Path) -> Path:
    """The resolved target; refuses '.', '..', '/', the current directory and its parents."""
    if target.name in ("", ".", ".."):
        raise WriteError("the output must name a new file or directory, not the current directory or a parent; "
                         "use e.g. -o ./model", path=target)
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved.parent == resolved:
        raise WriteError("refusing to write over the current directory or one of its parents; use e.g. "
                         "-o ./model", path=target)
    return resolved


def check_protected(target: Path, protect: Iterable[str | os.PathLike]) -> None:
    """Refuse a target that is, or contains, one of ``protect`` (the model's source, its inputs)."""
    resolved = target.resolve()
    for p in protect:
        src = Path(p).resolve()
        if src == resolved or resolved in src.parents:
            raise WriteError(f"the output would replace the model's own input {p}; choose another output path",
                             path=target)


def check_replaceable(target: Path) -> None:
    """Raise WriteError unless ``target`` (which exists) is an artifact cann-export wrote."""
    if target.is_symlink():
        raise WriteError("is a symbolic link; --overwrite replaces only artifacts cann-export wrote. Remove the "
                         "link or choose another path", path=target)
    zoo = next((d for d in (target, *target.resolve().parents) if (d / ZOO_INDEX).is_file()), None)
    if zoo is not None:
        raise WriteError(f"is {'a model zoo root' if zoo == target else 'inside the model zoo ' + str(zoo)} "
                         "(index.sqlite); --overwrite never replaces zoo content. Choose another output path",
                         path=target)
    if target.is_dir():
        _check_bundle_dir(target)
    elif target.is_file():
        if not (is_our_onnx(target) or is_om(target) or is_our_archive(target)):
            raise WriteError(_fix(target), path=target)
    else:
        raise WriteError("is not a regular file or directory; choose another output path", path=target)


def _check_bundle_dir(directory: Path) -> None:
    manifest = read_our_manifest(directory)
    if manifest is None:
        raise WriteError(_fix(directory) + " (no cann-export manifest.json in it)", path=directory)
    table = manifest.get("files")
    listed = set(table) if isinstance(table, (dict, list)) else set()
    extra = []
    for path in directory.rglob("*"):
        rel = path.relative_to(directory)
        if path.is_dir() and not path.is_symlink():
            continue
        if rel.as_posix() == MANIFEST or rel.as_posix() in listed or any(m in rel.name for m in _LITTER):
            continue
        extra.append(rel.as_posix())
        if len(extra) >= 3:
            break
    if extra:
        raise WriteError(_fix(directory) + f" (not in its manifest: {', '.join(extra)})", path=directory)


def is_our_archive(path: Path) -> bool:
    """A single-file bundle cann-export wrote (``-o x.pth``/``x.zip``): a zip whose root manifest.json is
    ours and lists every other member (a foreign zip, or ours with files added, is not)."""
    import zipfile

    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as zf:
            info = zf.NameToInfo.get(MANIFEST)
            if info is None or info.file_size > _MAX_SCAN or len(zf.infolist()) > 10_000:
                return False
            data = json.loads(zf.read(info).decode("utf-8"))
            names = [m.filename for m in zf.infolist() if not m.is_dir()]
    except (OSError, ValueError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError):
        return False
    if not _ours(data):
        return False
    table = data.get("files")
    listed = set(table) if isinstance(table, (dict, list)) else set()
    return all(n == MANIFEST or n in listed for n in names)


def _ours(data: object) -> bool:
    if not isinstance(data, dict):
        return False
    schema = data.get("schema")
    tool = (data.get("provenance") or {}).get("tool") if isinstance(data.get("provenance"), dict) else None
    return (isinstance(schema, str) and schema.startswith("cann-export/")) or \
        (isinstance(tool, str) and tool.startswith("cann-export"))


def read_our_manifest(directory: Path) -> dict | None:
    """The directory's manifest.json when it is one cann-export writes (bundle or zoo version), else None."""
    path = directory / MANIFEST
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_SCAN:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if _ours(data) else None


def is_om(path: Path) -> bool:
    """An offline model or om-stub: ATC's ModelFileHeader magic and head size."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return len(head) == 8 and struct.unpack("<II", head) == (_OM_MAGIC, _OM_HEAD)


def is_our_onnx(path: Path) -> bool:
    """An .onnx whose metadata_props carry ``cann_export.tool`` (read without loading the graph)."""
    try:
        props = onnx_metadata(path)
    except (OSError, ValueError):
        return False
    return str(props.get(ONNX_TOOL_KEY, "")).startswith("cann-export")


def onnx_metadata(path: Path) -> dict[str, str]:
    """ModelProto.metadata_props (field 14) from the protobuf wire format, seeking past the graph."""
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while f.tell() < size:
            key = _varint(f)
            field, wire = key >> 3, key & 7
            if wire == 0:
                _varint(f)
            elif wire == 1:
                f.seek(8, os.SEEK_CUR)
            elif wire == 5:
                f.seek(4, os.SEEK_CUR)
            elif wire == 2:
                length = _varint(f)
                if f.tell() + length > size:
                    raise ValueError("truncated protobuf")
                if field == 14 and length <= _MAX_SCAN:
                    k, v = _string_pair(f.read(length))
                    out[k] = v
                else:
                    f.seek(length, os.SEEK_CUR)
            else:
                raise ValueError("not an ONNX model")
    return out


def _varint(f) -> int:
    shift = result = 0
    while True:
        b = f.read(1)
        if not b:
            raise ValueError("truncated protobuf")
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError("bad varint")


def _string_pair(raw: bytes) -> tuple[str, str]:
    """StringStringEntryProto: key = 1, value = 2."""
    import io

    f, pair = io.BytesIO(raw), {1: "", 2: ""}
    while f.tell() < len(raw):
        key = _varint(f)
        if key & 7 != 2:
            raise ValueError("not a metadata entry")
        n = _varint(f)
        pair[key >> 3] = f.read(n).decode("utf-8", "replace")
    return pair[1], pair[2]


_MAX_GRAPH_SCAN = 64 << 20  # an .onnx that keeps its weights outside is small; a bigger one is not parsed


def our_external_data(path: Path) -> list[str]:
    """``<name>.data`` when the .onnx at ``path`` keeps weights in it: the one external-data name cann-export
    writes. Any other location the file names is not ours to remove, whatever the file claims."""
    name = Path(path).name + ".data"
    if not (Path(path).parent / name).exists():  # nothing there to go stale: the graph is not read (nor onnx imported)
        return []
    import onnx

    try:
        if Path(path).stat().st_size > _MAX_GRAPH_SCAN:
            return []
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - unreadable: nothing is known to be its companion
        return []
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and any(
                e.key == "location" and e.value == name for e in t.external_data):
            return [name]
    return []
