"""A real ATC ``.om`` read by ``inspect``: its 256-byte ``ModelFileHeader`` in either published layout and, where
``atc`` is installed, what ``atc --mode=1`` (om -> JSON) says of it. Nothing past the header is read by us.

The two layouts (little-endian, packed; CANN's GraphEngine ``inc/framework/common/types.h`` and the 2023
``inc/framework/executor/c_types.h``) differ only after ``om_ir_version``::

    off size  2019-20 layout            2023 layout
      0   4   magic 0x444F4D49          magic
      4   4   headsize 256              headsize
      8   4   version                   version
     12  64   checksum                  checksum
     76   4   length (bytes after the header)
     80   4   is_encrypt, is_checksum, modeltype, genmode (one byte each)
     84  32   name                      name
    116   4   ops                       ops
    120  32   userdefineinfo            userdefineinfo
    152   4   om_ir_version             om_ir_version
    156   4   platform_version[0:4]     model_num (1; more for a dynamic-gear model)
    160  16   platform_version[4:20]    platform_version[0:16]
    176   4   platform_type + reserved  platform_version[16:20]
    ...       reserved[79]              platform_type, reserved[75]

The layout is told apart by offset 156: a platform_version string starts with a printable character, a model_num
is a small count. An om-stub (``om_stub``) uses the 2019-20 layout with ``CANN-EXPORT-STUB`` in userdefineinfo;
a header with that mark is read as a stub (and its sha256 checked there), any other as a compiled model.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ValidateError
from ..fs.regular import check_regular_file
from .om_stub import HEAD_SIZE, MAGIC, STUB_MARK

LAYOUT_2019 = struct.Struct("<III64sIBBBB32sI32sI20sB79s")
LAYOUT_2023 = struct.Struct("<III64sIBBBB32sI32sII20sB75s")
assert LAYOUT_2019.size == LAYOUT_2023.size == HEAD_SIZE
COMMON = ("magic", "headsize", "version", "checksum", "length", "is_encrypt", "is_checksum", "modeltype", "genmode",
          "name", "ops", "userdefineinfo", "om_ir_version")
FIELDS = {"2019-20": (*COMMON, "platform_version", "platform_type", "reserved"),
          "2023": (*COMMON, "model_num", "platform_version", "platform_type", "reserved")}
MODEL_TYPES = {0: "IR model", 1: "standard model", 2: "OM tiny model", 3: "flow model"}
MAX_MODEL_NUM = 255  # a count of gear models, far below what a 2019-20 platform_version string reads as
ATC_TIMEOUT_S = 120
MAX_JSON_BYTES = 64 << 20  # atc --mode=1 of a large model writes tens of MiB: read no more than this
JSON_ATTRS = ("soc_version", "atc_cmdline", "framework_type", "om_info_list", "input_shape", "op_select_implmode")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _printable_or_empty(raw: bytes) -> bool:
    text = raw.split(b"\0", 1)[0]
    return all(0x20 <= b < 0x7F for b in text)


def layout_of(head: bytes) -> str | None:
    """Which published ModelFileHeader layout ``head`` (256 bytes) is in, or None when neither reads cleanly.
    All zeros after om_ir_version read the same in both but for model_num: they are taken as 2019-20."""
    if 0x20 <= head[156] < 0x7F:  # text: the 2019-20 platform_version
        return "2019-20" if _printable_or_empty(head[156:176]) else None
    model_num = struct.unpack_from("<I", head, 156)[0]
    if not any(head[156:180]):
        return "2019-20"
    if model_num <= MAX_MODEL_NUM and _printable_or_empty(head[160:180]):
        return "2023"
    return None


def parse_header(head: bytes) -> dict[str, Any]:
    """The fields of a 256-byte om header (either layout), checked for magic and size; raises ValueError with
    the reason when it is not one."""
    if len(head) < HEAD_SIZE:
        raise ValueError(f"{len(head)} bytes, shorter than the {HEAD_SIZE}-byte om header")
    magic = struct.unpack_from("<I", head)[0]
    if magic != MAGIC:
        raise ValueError(f"magic 0x{magic:08X}, expected 0x{MAGIC:08X}")
    headsize = struct.unpack_from("<I", head, 4)[0]
    if headsize != HEAD_SIZE:
        raise ValueError(f"header size {headsize}, expected {HEAD_SIZE}")
    layout = layout_of(head[:HEAD_SIZE])
    if layout is None:
        raise ValueError("the bytes after om_ir_version fit neither the 2019-20 nor the 2023 ModelFileHeader layout")
    packer = LAYOUT_2023 if layout == "2023" else LAYOUT_2019
    raw = dict(zip(FIELDS[layout], packer.unpack(head[:HEAD_SIZE]), strict=True))
    raw.pop("reserved")
    info: dict[str, Any] = {"layout": layout, **raw}
    info["checksum"] = raw["checksum"].hex()
    info["magic_hex"] = f"0x{raw['magic']:08X}"
    info["version_hex"] = f"0x{raw['version']:08X}"
    for key in ("name", "userdefineinfo", "platform_version"):
        info[key] = _text(raw[key])
    info["model_type"] = MODEL_TYPES.get(raw["modeltype"], f"type {raw['modeltype']}")
    info["stub"] = raw["userdefineinfo"].startswith(STUB_MARK)
    return info


def claims_compiled(path: Path) -> bool:
    """Whether ``path`` is a regular file starting with the om magic and without the om-stub mark: what ATC
    writes, to be read (or refused) as a compiled model (one bounded read of the header)."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            head = f.read(HEAD_SIZE)
    except OSError:
        return False
    if len(head) != HEAD_SIZE or struct.unpack_from("<I", head)[0] != MAGIC:
        return False
    return not head[120:].startswith(STUB_MARK)


def read_real_om(path: str | Path) -> dict[str, Any]:
    """The header of a compiled ATC model at ``path``, after checking magic, size and length against the file:
    one read of 256 bytes, whatever the header claims. Raises ValidateError naming the file."""
    path = Path(path)
    check_regular_file(path, "om file", "Pass a model.om written by ATC or cann-export", ValidateError)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEAD_SIZE)
    try:
        info = parse_header(head)
    except ValueError as e:
        raise ValidateError(f"not a readable om file: {e}; pass a model.om written by ATC or cann-export",
                            path=path, stage="inspect") from e
    if info["length"] != size - HEAD_SIZE:
        what = "truncated" if size - HEAD_SIZE < info["length"] else "has trailing bytes"
        raise ValidateError(f"om file {what}: the header says {info['length']} bytes after it, the file holds "
                            f"{size - HEAD_SIZE}; convert or download it again", path=path, stage="inspect")
    return info


def atc_json(path: Path, atc: str | None = None) -> dict[str, Any] | None:
    """What ``atc --mode=1 --om=PATH --json=OUT`` says of the model (the graph's attributes named in
    ``JSON_ATTRS``, such as soc_version and atc_cmdline), or None without ``atc``; a failed run gives its error."""
    exe = atc or shutil.which("atc")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="cann-export-omjson-") as tmp:
        out = Path(tmp) / "model.json"
        args = ["atc", "--mode=1", f"--om={os.path.abspath(path)}", f"--json={out}"]
        try:
            proc = subprocess.run(args, executable=exe, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=ATC_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"atc --mode=1 did not finish: {type(e).__name__}"}
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip().splitlines()[-3:]
            return {"error": f"atc --mode=1 exited {proc.returncode}: {' | '.join(tail)}"[:800]}
        if out.stat().st_size > MAX_JSON_BYTES:
            return {"error": f"atc --mode=1 wrote {out.stat().st_size} bytes of JSON, past the {MAX_JSON_BYTES} "
                             "this reads"}
        try:
            doc = json.loads(out.read_bytes())
        except ValueError as e:
            return {"error": f"atc --mode=1 wrote JSON that does not parse ({e})"}
    return {"attrs": _graph_attrs(doc), "graphs": _graph_names(doc)}


def _graph_attrs(doc: Any) -> dict[str, str]:
    """The allow-listed ``attr`` entries of the model and of its graphs (``{"key": k, "value": {"s": v}}``)."""
    found: dict[str, str] = {}
    holders = [doc] + (doc.get("graph") if isinstance(doc, dict) and isinstance(doc.get("graph"), list) else [])
    for holder in holders:
        entries = holder.get("attr") if isinstance(holder, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or entry.get("key") not in JSON_ATTRS:
                continue
            value = entry.get("value")
            if isinstance(value, dict):
                value = value.get("s", value.get("i", value.get("list")))
            found.setdefault(entry["key"], str(value)[:2000])
    return found


def _graph_names(doc: Any) -> list[str]:
    graphs = doc.get("graph") if isinstance(doc, dict) else None
    return [str(g.get("name"))[:200] for g in graphs[:64] if isinstance(g, dict)] if isinstance(graphs, list) else []


def describe_real_om(path: Path) -> dict[str, Any]:
    """``inspect``'s object for a compiled ATC model: its header fields and, where ``atc`` exists, its JSON."""
    header = read_real_om(path)
    info: dict[str, Any] = {"kind": "om", "path": str(path), "size_bytes": path.stat().st_size,
                            "om": {**header, "kind": "compiled"}}
    described = atc_json(path)
    notes = [f"a compiled ATC offline model (ModelFileHeader, {header['layout']} layout): name {header['name']!r}, "
             f"platform {header['platform_version']!r}, {header['model_type']}"
             + (", encrypted" if header["is_encrypt"] else "")]
    if described is None:
        notes.append("no `atc` on PATH: only the header was read (with CANN installed, inspect adds what "
                     "`atc --mode=1` reads from the model: soc_version, atc_cmdline)")
    else:
        info["atc_json"] = described
    info["notes"] = notes
    return info
