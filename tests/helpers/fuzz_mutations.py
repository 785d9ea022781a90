"""Mutations of real artifacts, as plain data (tuples) hypothesis draws, prints and shrinks, and the
functions that apply them: bytes (flips, truncation, extension), zip structure (renamed, duplicated,
dropped or replaced members, payload members, lying sizes and offsets, a second archive) and JSON (hostile
values, keys and deep nesting put anywhere in a document)."""
from __future__ import annotations

import copy
import io
import json
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from . import fuzz_payloads as payloads

# --------------------------------------------------------------------------------------------- bytes

_INT = st.integers(0, 1 << 32)
BYTE_OPS = st.one_of(
    st.tuples(st.just("flip"), _INT, st.integers(1, 255)),
    st.tuples(st.just("truncate"), _INT),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("insert"), _INT, st.binary(min_size=1, max_size=64)),
)


def apply_bytes(data: bytes, op: tuple) -> bytes:
    kind = op[0]
    if kind == "extend":
        return data + op[1]
    if not data:
        return data
    at = op[1] % len(data)
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ op[2]]) + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    return data[:at] + op[2] + data[at:]  # insert


# ---------------------------------------------------------------------------------------------- JSON

HOSTILE_VALUES = (None, True, -1, 0, 1 << 63, 1e308, float("nan"), float("inf"), "", "..", "../../escape",
                  "/etc/passwd", "a" * 6000, "x/" * 3000, "a\x00b", "\ud800", "C:\\x",
                  "torch.ops.aten.from_file.default", "torch.os.system", "__import__('os').system('true')", [], {},
                  [[[[[[1]]]]]], {"a": {"b": {}}}, "DEEP", "PAYLOAD")  # seeds name some by index: append only
HOSTILE_KEYS = ("guards_code", "future_code", "expr_str", "", "..", "../x", "a" * 6000, "\x00", "files", "format")
_PICK = st.integers(0, 1 << 16)
JSON_OPS = st.one_of(
    st.tuples(st.just("set"), _PICK, st.sampled_from(range(len(HOSTILE_VALUES)))),
    st.tuples(st.just("delete"), _PICK),
    st.tuples(st.just("add_key"), _PICK, st.sampled_from(range(len(HOSTILE_KEYS))),
              st.sampled_from(range(len(HOSTILE_VALUES)))),
    st.tuples(st.just("swap"), _PICK),
)
_DEEP = "\u2063DEEP\u2063"  # placeholder, replaced by raw nesting no encoder writes


def _hostile(index: int, marker: Path) -> Any:
    value = copy.deepcopy(HOSTILE_VALUES[index])  # a fresh object: never the same list twice in one document
    if value == "DEEP":
        return _DEEP
    if value == "PAYLOAD":
        return {"expr_str": payloads.python_code(marker), "guards_code": [payloads.python_code(marker)]}
    return value


def _containers(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) slot of ``doc``, depth first (``(None, None)``: the document itself)."""
    slots, stack = [(None, None)], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            slots.append((node, key))
            stack.append(child)
    return slots


def apply_json(doc: Any, op: tuple, marker: Path) -> Any:
    """``doc`` with ``op`` applied at the slot ``op[1]`` picks (modulo their number)."""
    slots = _containers(doc)
    parent, key = slots[op[1] % len(slots)]
    current = doc if parent is None else parent[key]
    if op[0] == "set":
        new = _hostile(op[2], marker)
    elif op[0] == "delete":
        if parent is None:
            return doc
        del parent[key]
        return doc
    elif op[0] == "add_key":
        if not isinstance(current, dict):
            return doc
        current[HOSTILE_KEYS[op[2]]] = _hostile(op[3], marker)
        return doc
    else:  # swap: an object becomes a list of its values, anything else an object holding it
        new = list(current.values()) if isinstance(current, dict) else {"0": current}
    if parent is None:
        return new
    parent[key] = new
    return doc


def dump_json(doc: Any) -> bytes:
    """JSON text of ``doc`` as a careless or hostile writer makes it: NaN allowed, lone surrogates kept, the
    DEEP placeholder replaced by 100000 levels of nesting."""
    text = json.dumps(doc, allow_nan=True)
    deep = "[" * 100_000 + "]" * 100_000
    return text.replace(json.dumps(_DEEP), deep).encode("utf-8", "surrogatepass")


def mutate_json_bytes(raw: bytes, ops: list[tuple], marker: Path) -> bytes:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    for op in ops:
        doc = apply_json(doc, op, marker)
    return dump_json(doc)


# ----------------------------------------------------------------------------------------------- zip

MEMBER_NAMES = ("{root}/../../escape", "/abs/path", "{root}\\..\\x", "C:/x", "{root}/" + "a" * 6000,
                "{root}/data/aotinductor/model/x.so", "{root}/extra/libpayload.so.1", "{root}/data/weights/model.pt",
                "{root}/data/constants/model.pt", "{root}/data/sample_inputs/model.pt", "{root}/models/model.json",
                "{root}/serialized_example_inputs.pt", "manifest.json", "../manifest.json", "{root}/a/./b", "")
_NAME = st.sampled_from(range(len(MEMBER_NAMES)))
_PAYLOAD = st.sampled_from(payloads.KINDS)
ZIP_OPS = st.one_of(
    st.tuples(st.just("rename"), _PICK, _NAME),
    st.tuples(st.just("nul_name"), _PICK),
    st.tuples(st.just("duplicate"), _PICK, st.booleans()),
    st.tuples(st.just("drop"), _PICK),
    st.tuples(st.just("replace"), _PICK, _PAYLOAD),
    st.tuples(st.just("add"), _NAME, _PAYLOAD),
    st.tuples(st.just("json"), _PICK, st.lists(JSON_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("member_bytes"), _PICK, st.lists(BYTE_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("declared"), _PICK, st.sampled_from((20, 24)), st.sampled_from((0, 1, 1 << 20, 0xFFFFFFFF))),
    st.tuples(st.just("offset"), _PICK, _INT),
    st.tuples(st.just("header16"), _PICK, st.sampled_from((6, 8, 10)),
              st.sampled_from((1, 0x20, 0x40, 84, 99, 0xFFFF))),
    st.tuples(st.just("stream"), _PICK),
    st.tuples(st.just("second_archive"), st.booleans()),
)
ARCHIVE_OPS = st.lists(st.one_of(ZIP_OPS, BYTE_OPS), min_size=1, max_size=4)


def _entries(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [(info, z.read(info)) for info in z.infolist()]
    except Exception:  # noqa: BLE001 - not (any more) an archive zipfile reads: the zip ops do nothing
        return None


def _pack(entries: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as z:
        warnings.simplefilter("ignore")  # duplicate names are the point
        for info, data in entries:
            z.writestr(info, data)
    return out.getvalue()


def _info_like(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    new = zipfile.ZipInfo(name, date_time=info.date_time)
    new.compress_type, new.external_attr = info.compress_type, info.external_attr
    return new


def central_records(data: bytes) -> list[int]:
    """Offsets of the central directory records, walked from where zipfile finds the directory (a scan for
    the signature when zipfile cannot read it: it may then also hit a zip nested in a member)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            at, count = z.start_dir, len(z.infolist())
    except Exception:  # noqa: BLE001 - not readable any more: scan
        found, at = [], data.find(b"PK\x01\x02")
        while at >= 0:
            found.append(at)
            at = data.find(b"PK\x01\x02", at + 4)
        return found
    found = []
    while len(found) < count and data[at:at + 4] == b"PK\x01\x02":
        found.append(at)
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, at + 28)
        at += 46 + name_len + extra_len + comment_len
    return found


def _central(data: bytes, pick: int | str) -> int | None:
    """Offset of the central directory record ``pick`` chooses: a number (modulo the records) or a name."""
    found = central_records(data)
    if isinstance(pick, str):
        named = [a for a in found if data[a + 46:a + 46 + len(pick)] == pick.encode()]
        return named[0] if named else None
    return found[pick % len(found)] if found else None


def apply_archive(data: bytes, op: tuple, ctx: payloads.Context) -> bytes:
    """``data`` (a zip) with one ZIP_OPS or BYTE_OPS op applied; a zip op on bytes zipfile cannot read
    (an earlier op broke them) leaves them unchanged."""
    kind = op[0]
    if kind in ("flip", "truncate", "extend", "insert"):
        return apply_bytes(data, op)
    if kind == "second_archive":
        other = ctx.evil_archive()
        return other + data if op[1] else data + other
    if kind in ("declared", "offset", "header16"):  # a central directory field: sizes, local offset, or
        at = _central(data, op[1])                   # version needed (6), flags (8), compression (10)
        if at is None or at + 46 > len(data):
            return data
        field, value = (42, op[2] & 0xFFFFFFFF) if kind == "offset" else (op[2], op[3])
        raw = bytearray(data)
        struct.pack_into("<H" if kind == "header16" else "<I", raw, at + field, value)
        return bytes(raw)
    entries = _entries(data)
    if not entries:
        return data
    root = entries[0][0].filename.split("/")[0]
    i = _index(entries, op[1]) if kind != "add" else 0
    info, body = entries[i]
    if kind == "rename":
        entries[i] = (_info_like(info, MEMBER_NAMES[op[2]].replace("{root}", root)), body)
    elif kind == "nul_name":
        return _nul_in_name(data, info.filename)
    elif kind == "stream":
        return _corrupt_stream(data, info.filename)
    elif kind == "duplicate":
        entries.append((_info_like(info, info.filename), ctx.payload("pickle-protocol2") if op[2] else body))
    elif kind == "drop":
        del entries[i]
    elif kind == "replace":
        entries[i] = (info, ctx.payload(op[2]))
    elif kind == "add":
        entries.append((zipfile.ZipInfo(MEMBER_NAMES[op[1]].replace("{root}", root) or "x"), ctx.payload(op[2])))
    elif kind == "json":
        entries[i] = (info, mutate_json_bytes(body, op[2], ctx.marker))
    elif kind == "member_bytes":
        for byte_op in op[2]:
            body = apply_bytes(body, byte_op)
        entries[i] = (info, body)
    return _pack(entries)


def _index(entries: list[tuple[zipfile.ZipInfo, bytes]], pick: int | str) -> int:
    """The member ``pick`` chooses: a number (modulo the members), or a name (a crafted case's target)."""
    if isinstance(pick, str):
        return next((i for i, (info, _) in enumerate(entries) if info.filename == pick), 0)
    return pick % len(entries)


def _corrupt_stream(data: bytes, name: str) -> bytes:
    """The member's first data byte with the two block-type bits set: a deflate stream zlib refuses as
    "invalid block type" (a stored member's first byte merely changes), its sizes and CRC left as they were."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        offset = z.getinfo(name).header_offset  # from the start of ``data`` (zipfile adds any prefix)
    if data[offset:offset + 4] != b"PK\x03\x04":
        return data
    name_len, extra_len = struct.unpack_from("<HH", data, offset + 26)
    at = offset + 30 + name_len + extra_len
    return data[:at] + bytes([data[at] | 0x06]) + data[at + 1:] if at < len(data) else data


def _nul_in_name(data: bytes, name: str) -> bytes:
    """The member's name with a NUL for its last character, in the local header and central directory."""
    raw = name.encode("utf-8")
    if not raw:
        return data
    return data.replace(raw, raw[:-1] + b"\x00")


def apply_all(data: bytes, ops: list[tuple], ctx: payloads.Context) -> bytes:
    for op in ops:
        data = apply_archive(data, op, ctx)
    return data
