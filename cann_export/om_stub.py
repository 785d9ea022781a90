"""om-stubs: a ``.om`` file that carries an atc_ready bundle until ATC turns it into a real offline model.

The first 256 bytes are laid out like ATC's ``ModelFileHeader`` (GraphEngine ``inc/framework/common/types.h``,
little-endian, no padding)::

    off size field
      0   4  magic            0x444F4D49 ("IMOD" on disk), MODEL_FILE_MAGIC_NUM
      4   4  headsize         256, MODEL_FILE_HEAD_LEN
      8   4  version          0x10000000, MODEL_VERSION (1.0)
     12  64  checksum         here: sha256 of the payload, 64 lowercase hex digits
     76   4  length           payload bytes = file size - 256
     80   1  is_encrypt       0 (UNENCRYPTED)
     81   1  is_checksum      0 (CHECK)
     82   1  modeltype        0
     83   1  genmode          0 (offline)
     84  32  name             model name, NUL padded
    116   4  ops              0
    120  32  userdefineinfo   b"CANN-EXPORT-STUB/<stub version>", NUL padded: marks a stub
    152   4  om_ir_version    0
    156  20  platform_version the bundle's --soc_version
    176   1  platform_type    0
    177  79  reserved         zeros

The payload is a zip of the bundle (model.onnx [+ .data], manifest.json, parity.json, parity/*, atc/*, ...).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from .errors import ValidateError, WriteError

MAGIC = 0x444F4D49
HEAD_SIZE = 256
MODEL_VERSION = 0x10000000
STUB_MARK = b"CANN-EXPORT-STUB"
STUB_VERSION = 1
HEADER = struct.Struct("<III64sIBBBB32sI32sI20sB79s")
assert HEADER.size == HEAD_SIZE
FIELDS = ("magic", "headsize", "version", "checksum", "length", "is_encrypt", "is_checksum", "modeltype",
          "genmode", "name", "ops", "userdefineinfo", "om_ir_version", "platform_version", "platform_type",
          "reserved")
_MAX_LENGTH = 0xFFFFFFFF
_BIG_FILE = 16 << 20  # stored, not deflated, past this size (weights barely compress)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so the same bundle gives the same stub


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _fixed(text: str | bytes, size: int) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    raw = raw[: size - 1]  # keep a terminating NUL, as ATC does
    while raw:  # never cut a UTF-8 sequence in half
        try:
            raw.decode("utf-8")
            break
        except UnicodeDecodeError:
            raw = raw[:-1]
    return raw.ljust(size, b"\0")


def _bundle_files(bundle_dir: Path, exclude: Path | None) -> list[Path]:
    files = []
    for p in sorted(bundle_dir.rglob("*")):
        if not p.is_file() or p.is_symlink() or (exclude is not None and p.resolve() == exclude.resolve()):
            continue
        if any(part.startswith(".") and ".cann-tmp-" in part for part in p.relative_to(bundle_dir).parts):
            continue
        files.append(p)
    return files


def _platform_version(bundle_dir: Path) -> str:
    try:
        manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
        return str((manifest.get("atc") or {}).get("soc_version") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def write_stub(path: str | Path, bundle_dir: str | Path, model_name: str) -> dict[str, Any]:
    """Write an om-stub at ``path`` holding every file under ``bundle_dir`` (``path`` itself excluded);
    atomic (temp name beside ``path``, then rename). Returns the header fields."""
    path, bundle_dir = Path(path), Path(bundle_dir)
    files = _bundle_files(bundle_dir, path)
    tmp_zip = tmp_stub = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".zip.tmp", dir=path.parent)
        os.close(fd)
        tmp_zip = Path(name)
        with zipfile.ZipFile(tmp_zip, "w", allowZip64=True) as zf:
            for f in files:
                info = zipfile.ZipInfo(f.relative_to(bundle_dir).as_posix(), date_time=_ZIP_TIME)
                info.external_attr = (stat.S_IFREG | (f.stat().st_mode & 0o777)) << 16
                size = f.stat().st_size
                info.compress_type = zipfile.ZIP_STORED if size > _BIG_FILE else zipfile.ZIP_DEFLATED
                with open(f, "rb") as src, zf.open(info, "w", force_zip64=size >= zipfile.ZIP64_LIMIT) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        length = tmp_zip.stat().st_size
        if length > _MAX_LENGTH:
            raise WriteError(f"the bundle is {length} bytes zipped, past the 4 GiB an om header's length field "
                             "holds; use --format atc_ready, or install CANN's toolkit so ATC writes the real "
                             "model.om", path=path)
        h = hashlib.sha256()
        with open(tmp_zip, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        mark = STUB_MARK + b"/" + str(STUB_VERSION).encode()
        header = HEADER.pack(MAGIC, HEAD_SIZE, MODEL_VERSION, digest.encode("ascii"), length, 0, 0, 0, 0,
                             _fixed(model_name, 32), 0, _fixed(mark, 32), 0,
                             _fixed(_platform_version(bundle_dir), 20), 0, b"\0" * 79)
        tmp_stub = path.with_name(f".{path.name}.{os.getpid()}.stub.tmp")
        with open(tmp_stub, "wb") as out, open(tmp_zip, "rb") as src:
            out.write(header)
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp_stub, path)
        tmp_stub = None
    finally:
        for tmp in (tmp_zip, tmp_stub):
            if tmp is not None and tmp.exists():
                tmp.unlink()
    return _header_dict(HEADER.unpack(header))


def _header_dict(values: tuple) -> dict[str, Any]:
    raw = dict(zip(FIELDS, values))
    raw.pop("reserved")
    info = dict(raw)
    info["checksum"] = raw["checksum"].rstrip(b"\0").decode("ascii", "replace")
    info["name"] = _cstr(raw["name"])
    info["userdefineinfo"] = _cstr(raw["userdefineinfo"])
    info["platform_version"] = _cstr(raw["platform_version"])
    info["magic_hex"] = f"0x{raw['magic']:08X}"
    mark = raw["userdefineinfo"]
    info["stub"] = mark.startswith(STUB_MARK)
    if info["stub"]:
        tail = _cstr(mark[len(STUB_MARK):]).lstrip("/")
        info["stub_version"] = int(tail) if tail.isdigit() else None
    return info


def read_header(path: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The header of an om-stub, after checking size, magic, length, the stub mark and (``verify``) the
    payload's sha256. Raises ValidateError naming the file for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ValidateError("om file not found; pass the model.om an om export wrote", path=path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEAD_SIZE)
        if len(head) < HEAD_SIZE:
            raise ValidateError(f"truncated om file: {size} bytes, shorter than the {HEAD_SIZE}-byte om header; "
                                "the file is damaged, export or download it again", path=path)
        info = _header_dict(HEADER.unpack(head))
        if info["magic"] != MAGIC:
            raise ValidateError(f"not an om file: magic {info['magic_hex']}, expected 0x{MAGIC:08X}; pass a "
                                "model.om written by cann-export or ATC", path=path)
        if info["headsize"] != HEAD_SIZE:
            raise ValidateError(f"om header size is {info['headsize']}, expected {HEAD_SIZE}; the file is damaged",
                                path=path)
        if info["length"] != size - HEAD_SIZE:
            what = "truncated" if size - HEAD_SIZE < info["length"] else "has trailing bytes"
            raise ValidateError(f"om file {what}: the header says {info['length']} payload bytes, the file holds "
                                f"{size - HEAD_SIZE}; export or download it again", path=path)
        if not info["stub"]:
            raise ValidateError("a compiled ATC offline model, not a cann-export om-stub: it holds no ONNX graph "
                                "or parity data; pass the bundle or stub it was converted from", path=path)
        if info["is_encrypt"]:
            raise ValidateError("encrypted om-stubs are not supported", path=path)
        if verify:
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            if h.hexdigest() != info["checksum"]:
                raise ValidateError("om-stub payload does not match the sha256 in its header (the file was "
                                    "modified or damaged); export or download it again", path=path)
    return info


def is_om_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that should be read as an om (``.om`` suffix or the om magic)."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix == ".om":
        return True
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def read_stub(path: str | Path) -> tuple[dict[str, Any], bytes]:
    """``(header fields, payload bytes)`` of a verified om-stub (the payload is a zip of the bundle)."""
    info = read_header(path)
    with open(path, "rb") as f:
        f.seek(HEAD_SIZE)
        return info, f.read()


def _safe_name(name: str) -> PurePosixPath | None:
    p = PurePosixPath(name)
    if not name or name.endswith("/") or p.is_absolute() or "\\" in name or any(part in ("..", "") for part in p.parts):
        return None
    return p


def extract_stub(path: str | Path, dest_dir: str | Path) -> dict[str, Any]:
    """Verify an om-stub and unpack its bundle into ``dest_dir``; returns the header fields."""
    path, dest_dir = Path(path), Path(dest_dir)
    info = read_header(path)
    with open(path, "rb") as f:
        f.seek(HEAD_SIZE)
        try:
            with zipfile.ZipFile(_Window(f, HEAD_SIZE, info["length"])) as zf:
                names = zf.namelist()
                if len(set(names)) != len(names):
                    raise ValidateError("om-stub payload lists a file twice; the file is damaged", path=path)
                for member in zf.infolist():
                    rel = _safe_name(member.filename)
                    if rel is None:
                        raise ValidateError(f"om-stub payload holds an unsafe path {member.filename!r}; refusing "
                                            "to unpack it", path=path)
                    target = dest_dir.joinpath(*rel.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(member) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    mode = (member.external_attr >> 16) & 0o777
                    if mode:
                        os.chmod(target, mode)
        except (zipfile.BadZipFile, OSError) as e:
            raise ValidateError(f"om-stub payload is not a readable bundle ({type(e).__name__}: {e}); the file is "
                                "damaged", path=path) from None
    return info


@contextlib.contextmanager
def extracted(path: str | Path) -> Iterator[Path]:
    """A temporary directory holding the stub's bundle, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cann-export-om-") as tmp:
        extract_stub(path, tmp)
        yield Path(tmp)


class _Window:
    """A read-only, seekable view of ``length`` bytes of ``f`` starting at ``start`` (the zip payload),
    so zipfile reads the payload in place without loading it into memory."""

    def __init__(self, f: BinaryIO, start: int, length: int):
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._length - self._pos)
        n = left if n is None or n < 0 else min(n, left)
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data
