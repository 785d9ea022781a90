"""om-stubs: a ``.om`` file that carries an atc_ready bundle until ATC turns it into a real offline model.

The first 256 bytes are laid out like ATC's ``ModelFileHeader`` (GraphEngine ``inc/framework/common/types.h``,
little-endian, no padding)::

    off size field
      0   4  magic            0x444F4D49 ("IMOD" on disk), MODEL_FILE_MAGIC_NUM
      4   4  headsize         256, MODEL_FILE_HEAD_LEN
      8   4  version          0x10000000, MODEL_VERSION (1.0)
     12  64  checksum         here: sha256 of the 256-byte header (this field zeroed) followed by the
                              payload, 64 lowercase hex digits: no header field changes undetected
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

The payload is a zip of the bundle (model.onnx [+ .data], manifest.json, parity.json, parity/*, atc/*, ...),
written in place after the header (its offsets count from the start of the file, as in a self-extracting
archive, so ``zipfile.ZipFile("model.om")`` reads it directly).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ValidateError, WriteError
from ..fs import digests
from ..load.archives import ZIP_READ_ERRORS
from . import single_file

MAGIC = 0x444F4D49
HEAD_SIZE = 256
MODEL_VERSION = 0x10000000
STUB_MARK = b"CANN-EXPORT-STUB"
STUB_VERSION = 2  # 2: the checksum covers the header as well as the payload
HEADER = struct.Struct("<III64sIBBBB32sI32sI20sB79s")
assert HEADER.size == HEAD_SIZE
FIELDS = ("magic", "headsize", "version", "checksum", "length", "is_encrypt", "is_checksum", "modeltype",
          "genmode", "name", "ops", "userdefineinfo", "om_ir_version", "platform_version", "platform_type",
          "reserved")
_MAX_LENGTH = 0xFFFFFFFF
_CHECKSUM = slice(12, 76)


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


def _platform_version(bundle_dir: Path) -> str:
    try:
        manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
        return str((manifest.get("atc") or {}).get("soc_version") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def header_digest(head: bytes, f: BinaryIO, length: int) -> str:
    """sha256 of the header with its checksum field zeroed, then the ``length`` payload bytes read from ``f``:
    every header field (version, name, ops, platform, is_checksum, ...) is covered, the digest itself not."""
    h = hashlib.sha256(head[:_CHECKSUM.start] + b"\0" * (_CHECKSUM.stop - _CHECKSUM.start) + head[_CHECKSUM.stop:])
    return digests.sha256_stream(f, length, h)


def write_stub(path: str | Path, bundle_dir: str | Path, model_name: str,
               exclude: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Write an om-stub at ``path`` holding every file under ``bundle_dir`` (``path`` and ``exclude``
    left out); the zip is written in place after the header, and the file is renamed into place when whole."""
    path, bundle_dir = Path(path), Path(bundle_dir)
    files = single_file.bundle_files(bundle_dir, (path, *exclude))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.stub.tmp")
    try:
        with open(tmp, "w+b") as out:
            out.write(b"\0" * HEAD_SIZE)
            single_file.write_zip(out, bundle_dir, files)
            length = out.tell() - HEAD_SIZE
            if length > _MAX_LENGTH:
                raise WriteError(f"the bundle is {length} bytes zipped, past the 4 GiB an om header's length "
                                 "field holds; use --format atc_ready, or install CANN's toolkit so ATC writes "
                                 "the real model.om", path=path)
            mark = STUB_MARK + b"/" + str(STUB_VERSION).encode()
            fields = [MAGIC, HEAD_SIZE, MODEL_VERSION, b"\0" * 64, length, 0, 0, 0, 0, _fixed(model_name, 32), 0,
                      _fixed(mark, 32), 0, _fixed(_platform_version(bundle_dir), 20), 0, b"\0" * 79]
            out.seek(HEAD_SIZE)
            fields[3] = header_digest(HEADER.pack(*fields), out, length).encode("ascii")
            header = HEADER.pack(*fields)
            out.seek(0)
            out.write(header)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return _header_dict(HEADER.unpack(header))


def _header_dict(values: tuple) -> dict[str, Any]:
    raw = dict(zip(FIELDS, values, strict=False))
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
        if info["stub_version"] != STUB_VERSION:
            raise ValidateError(f"om-stub version {info['stub_version']} is not the version this cann-export reads "
                                f"({STUB_VERSION}: its sha256 covers the header too); export it again", path=path)
        if verify and header_digest(head, f, info["length"]) != info["checksum"]:
            raise ValidateError("om-stub header or payload does not match the sha256 in its header (the file was "
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


def extract_stub(path: str | Path, dest_dir: str | Path) -> dict[str, Any]:
    """Verify an om-stub and unpack its bundle into ``dest_dir`` (bounded reads, see bundle_zip);
    zipfile reads the archive in place behind the header. Returns the header fields."""
    path, dest_dir = Path(path), Path(dest_dir)
    info = read_header(path)
    try:
        with zipfile.ZipFile(path) as zf:
            single_file.extract(zf, info["length"], dest_dir, path, "om-stub payload")
    except ZIP_READ_ERRORS as e:
        raise ValidateError(f"om-stub payload is not a readable bundle ({e}); the file is damaged",
                            path=path) from e
    return info


@contextlib.contextmanager
def extracted(path: str | Path) -> Iterator[Path]:
    """A temporary directory holding the stub's bundle, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cann-export-om-") as tmp:
        extract_stub(path, tmp)
        yield Path(tmp)
