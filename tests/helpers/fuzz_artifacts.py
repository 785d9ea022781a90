"""Mutations of a real bundle directory, om-stub and zoo version, as the data hypothesis draws (see
fuzz_mutations), with the crafted cases of issue 16 for each written as the same data: the seed corpus."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
from pathlib import Path

from hypothesis import strategies as st

from cann_export.bundle import om_stub
from cann_export.fs import digests

from .fuzz_mutations import ARCHIVE_OPS, BYTE_OPS, JSON_OPS, apply_all, apply_bytes, dump_json, mutate_json_bytes
from .fuzz_payloads import KINDS, Context

# ------------------------------------------------------------------------------------ bundle directories

RAW_MANIFESTS = ("", "[1, 2]", '{"schema": "cann-export/manifest/1", "format": "atc_', "DEEP", "NaN", "\xff\xfe")
LINK_TARGETS = ("/etc/passwd", "/dev/zero", "../outside.txt", ".", "/")
_ZERO = {"sha256": "0" * 64, "size": 1}
# the manifest tampering of tests/security/test_hostile_bundles.py and tests/security/test_bounded_inputs.py
BUNDLE_EDITS = {
    "parity flipped": lambda m: m["parity"].update(passed=not m["parity"]["passed"]),
    "tolerance widened": lambda m: m["parity"]["tolerance"].update(atol=1e9, rtol=1e9, min_cosine=-1.0),
    "atc command injected": lambda m: m["atc"].update(command=["atc", "--output=../../x", "--log=debug"]),
    "atc command a string": lambda m: m["atc"].update(command="atc --output=/x"),
    "unknown ATC hint": lambda m: m["atc"]["hints"].update(output="../../x"),
    "soc with an option": lambda m: m["atc"].update(soc_version="Ascend910B --output=/tmp/x"),
    "file table ../victim": lambda m: m["files"].update({"../victim.txt": _ZERO}),
    "file table 6000-character path": lambda m: m["files"].update({"a" * 6000: _ZERO}),
    "file table 300-byte component": lambda m: m["files"].update({"d/" + "b" * 300: _ZERO}),
    "file table sha256 ../": lambda m: m["files"].update({"model.onnx": {"sha256": "../../x", "size": 1}}),
    "model.file ../": lambda m: m["model"].update(file="../model.onnx"),
    "inputs a string": lambda m: m["model"].update(inputs="x"),
    "unknown format": lambda m: m.update(format="evil-plugin"),
    "metadata a number": lambda m: m["metadata"].update(license=3),
    "parity missing": lambda m: m.pop("parity"),
    "tolerance NaN": lambda m: m["parity"]["tolerance"].update(atol=float("nan")),
}
_PICK = st.integers(0, 1 << 16)
BUNDLE_OPS = st.lists(st.one_of(
    st.tuples(st.just("edit"), st.sampled_from(sorted(BUNDLE_EDITS))),
    st.tuples(st.just("manifest"), st.lists(JSON_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("manifest_bytes"), st.lists(BYTE_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("manifest_raw"), st.sampled_from(range(len(RAW_MANIFESTS)))),
    st.tuples(st.just("file_bytes"), _PICK, st.lists(BYTE_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("file_replace"), _PICK, st.sampled_from(KINDS)),
    st.tuples(st.just("symlink"), _PICK, st.sampled_from(range(len(LINK_TARGETS)))),
    st.tuples(st.just("fifo"), _PICK),
    st.just(("rehash",)),
), min_size=1, max_size=4)


def _bundle_files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "manifest.json")


def mutate_bundle(bundle: Path, ops: list[tuple], ctx: Context) -> None:
    """Apply BUNDLE_OPS to the bundle directory in place (``rehash``: the file table re-derived from the
    files, as an attacker hiding an edit does)."""
    manifest = bundle / "manifest.json"
    for op in ops:
        targets = _bundle_files(bundle)
        target = _target(bundle, targets, op[1]) if len(op) > 1 else None
        if op[0] == "edit":
            manifest.write_bytes(edit_json_bytes(manifest.read_bytes(), BUNDLE_EDITS[op[1]]))
        elif op[0] == "manifest":
            manifest.write_bytes(mutate_json_bytes(manifest.read_bytes(), op[1], ctx.marker))
        elif op[0] == "manifest_bytes":
            data = manifest.read_bytes()
            for byte_op in op[1]:
                data = apply_bytes(data, byte_op)
            manifest.write_bytes(data)
        elif op[0] == "manifest_raw":
            raw = RAW_MANIFESTS[op[1]]
            manifest.write_bytes(dump_json(raw) if raw == "DEEP" else b'{"files": NaN}' if raw == "NaN"
                                 else raw.encode("latin-1"))
        elif op[0] == "rehash":
            _rehash(bundle)
        elif target is None:
            continue
        elif op[0] == "file_bytes":
            data = target.read_bytes()
            for byte_op in op[2]:
                data = apply_bytes(data, byte_op)
            target.write_bytes(data)
        elif op[0] == "file_replace":
            target.write_bytes(ctx.payload(op[2]))
        elif op[0] == "symlink":
            target.unlink()
            target.symlink_to(LINK_TARGETS[op[2]])
        elif op[0] == "file_patch":
            target.write_bytes(target.read_bytes().replace(op[2], op[3]))
        elif op[0] == "fifo":
            target.unlink()
            os.mkfifo(target)


def _target(bundle: Path, targets: list[Path], pick: object) -> Path | None:
    """The bundle file ``pick`` chooses: a number (modulo the files) or a relative path (a crafted case's)."""
    if isinstance(pick, str):
        return bundle / pick if (bundle / pick).is_file() else None
    return targets[pick % len(targets)] if targets and isinstance(pick, int) else None


def edit_json_bytes(raw: bytes, edit) -> bytes:
    """``raw`` with ``edit`` applied to its document; unchanged where the document lacks what it edits."""
    try:
        doc = json.loads(raw)
        edit(doc)
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return raw
    return dump_json(doc)


def _rehash(bundle: Path) -> None:
    manifest = bundle / "manifest.json"
    try:
        data = json.loads(manifest.read_bytes())
        if not isinstance(data, dict):
            return
        table = digests.file_table(bundle)  # regular files only: no link or FIFO is followed
    except (ValueError, RecursionError, OSError):
        return
    data["files"] = table
    manifest.write_bytes(dump_json(data))


# The crafted manifest and file edits of tests/security/test_hostile_bundles.py and test_bounded_inputs.py, as ops.
BUNDLE_SEEDS = {
    "bundle: healthy": [],
    **{f"bundle: {key}": [("edit", key)] for key in BUNDLE_EDITS},
    "bundle: parity flipped, rehashed": [("edit", "parity flipped"), ("rehash",)],
    "bundle: deep nesting": [("manifest_raw", 3)],
    "bundle: not JSON": [("manifest_raw", 2)],
    "bundle: NaN": [("manifest_raw", 4)],
    "bundle: unknown keys, refused": [("manifest", [("add_key", 0, 0, 25), ("add_key", 0, 2, 19)])],
    "bundle: a swapped file, rehashed": [("file_replace", 0, "pickle-protocol2"), ("rehash",)],
    "bundle: a link to /dev/zero": [("symlink", 0, 1)],
    "bundle: a link out of the bundle": [("symlink", 0, 2)],
    "bundle: a FIFO for a file": [("fifo", 0)],
    "bundle: a FIFO for model.onnx": [("fifo", "model.onnx")],
    "bundle: model.onnx a link to /dev/zero": [("symlink", "model.onnx", 1)],
    "bundle: a metadata key that is not UTF-8": [("file_patch", "model.onnx", b"license", b"licens\xff")],
}
ARCHIVE_BUNDLE_SEEDS = {
    "zip bundle: healthy": [],
    "zip bundle: ../ member": [("add", 0, "python")],
    "zip bundle: 4 GiB declared": [("declared", 0, 24, 0xFFFFFFFF)],
    "zip bundle: a second manifest.json, a pickle": [("duplicate", "manifest.json", True)],
    "zip bundle: manifest deep": [("json", "manifest.json", [("set", 0, 24)])],
    "zip bundle: a corrupt deflate stream": [("stream", "manifest.json")],
    "zip bundle: strong-encryption flag": [("header16", "manifest.json", 8, 0x40)],
    "zip bundle: compressed-patch flag": [("header16", "manifest.json", 8, 0x20)],
    "zip bundle: zip version 8.4": [("header16", 0, 6, 84)],
    "zip bundle: manifest a pickle": [("replace", "manifest.json", "pickle-protocol2")],
    "zip bundle: M + Z": [("second_archive", True)],
}

# ------------------------------------------------------------------------------------------- om-stubs

STUB_OPS = st.tuples(st.lists(st.one_of(
    st.tuples(st.just("header"), st.integers(0, 255), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("payload"), ARCHIVE_OPS),
    BYTE_OPS,
), min_size=1, max_size=3), st.booleans())


def mutate_stub(data: bytes, ops: list[tuple], redigest: bool, ctx: Context) -> bytes:
    """Apply STUB_OPS to the stub's bytes; ``redigest``: then fix the length and checksum fields, so that the
    reader gets past the header check to the payload."""
    for op in ops:
        if op[0] == "header":
            at = min(op[1], max(len(data) - len(op[2]), 0))
            data = data[:at] + op[2] + data[at + len(op[2]):]
        elif op[0] == "payload":
            data = data[:om_stub.HEAD_SIZE] + apply_all(data[om_stub.HEAD_SIZE:], op[1], ctx)
        else:
            data = apply_bytes(data, op)
    if redigest and len(data) >= om_stub.HEAD_SIZE:
        head = bytearray(data[:om_stub.HEAD_SIZE])
        struct.pack_into("<I", head, 76, (len(data) - om_stub.HEAD_SIZE) & 0xFFFFFFFF)
        h = hashlib.sha256(bytes(head[:12]) + bytes(64) + bytes(head[76:]) + data[om_stub.HEAD_SIZE:])
        head[12:76] = h.hexdigest().encode()
        data = bytes(head) + data[om_stub.HEAD_SIZE:]
    return data


STUB_SEEDS = {
    "om-stub: healthy": ([], False),
    "om-stub: version field": ([("header", 8, struct.pack("<I", 0x20000000))], False),
    "om-stub: another platform, re-digested": ([("header", 156, b"Ascend910B\0")], True),
    "om-stub: stub version 1": ([("header", 120, b"CANN-EXPORT-STUB/1\0")], True),
    "om-stub: encrypted": ([("header", 80, b"\1")], True),
    "om-stub: length past the end": ([("header", 76, struct.pack("<I", 0xFFFFFFFF))], False),
    "om-stub: payload ../ member": ([("payload", [("add", 0, "python")])], True),
    "om-stub: payload declared 4 GiB": ([("payload", [("declared", 1, 24, 0xFFFFFFFF)])], True),
    "om-stub: payload manifest deep": ([("payload", [("json", "manifest.json", [("set", 0, 24)])])], True),
    "om-stub: payload file table ../": ([("payload", [("json", "manifest.json", [("add_key", 0, 8, 10)])])], True),
    "om-stub: payload a corrupt deflate stream": ([("payload", [("stream", "manifest.json")])], True),
    "om-stub: payload strong-encryption flag": ([("payload", [("header16", "manifest.json", 8, 0x40)])], True),
    "om-stub: payload zip version 8.4": ([("payload", [("header16", 0, 6, 84)])], True),
    "om-stub: payload a second archive, tolerated": ([("payload", [("second_archive", True)])], True),
}

# ---------------------------------------------------------------------------------------- zoo versions

ZOO_EDITS = {  # the forged manifests of tests/security/test_hostile_zoo.py
    "callable subprocess:call": lambda m, marker: m.update(architecture={
        "kind": "callable", "callable": "subprocess:call", "kwargs": {"args": ["touch", str(marker)]}}),
    "callable os:system": lambda m, marker: m.update(architecture={
        "kind": "callable", "callable": "os:system", "kwargs": {"command": f"touch {marker}"}}),
    "program ../x.pt2": lambda m, marker: m.update(architecture={"kind": "torch.export", "file": "../x.pt2"}),
    "file table ../../escape": lambda m, marker: m["files"].update({"../../escape.txt": _first(m)}),
    "file table /etc/passwd": lambda m, marker: m["files"].update({"/etc/passwd": _first(m)}),
    "sha256 ../": lambda m, marker: m["files"][_first_name(m)].update(sha256="../../victim"),
    "size -1": lambda m, marker: m["files"][_first_name(m)].update(size=-1),
    "weights ../": lambda m, marker: m.update(weights={"file": "../weights.safetensors"}),
    "artifact ../x": lambda m, marker: m.update(artifacts={"../x": {"path": "artifacts/../x", "model_file": "a"}}),
    "artifact model_file ../": lambda m, marker: [a.update(model_file="../../x") for a in m["artifacts"].values()],
    "version ../": lambda m, marker: m.update(version="../../../../escape"),
    "files a list": lambda m, marker: m.update(files=["model.onnx"]),
}


def _first_name(m: dict) -> str:
    return sorted(m["files"])[0]


def _first(m: dict) -> dict:
    return dict(m["files"][_first_name(m)])


ZOO_OPS = st.tuples(st.lists(st.one_of(
    st.tuples(st.just("edit"), st.sampled_from(sorted(ZOO_EDITS))),
    st.tuples(st.just("json"), st.lists(JSON_OPS, min_size=1, max_size=3)),
    st.tuples(st.just("bytes"), st.lists(BYTE_OPS, min_size=1, max_size=2)),
), min_size=1, max_size=2), st.booleans())


def forge_zoo_manifest(zoo: Path, ops: list[tuple], forge: bool, ctx: Context) -> None:
    """Edit version 1 of model ``m`` as someone with write access to the store; ``forge``: recompute the
    manifest's digest and the index's digest and sha256 so that only the content checks are left."""
    from cann_export.model_zoo.file_copies import manifest_digest

    path = zoo / "models" / "m" / "1" / "manifest.json"
    raw = path.read_bytes()
    for op in ops:
        if op[0] == "edit":
            raw = edit_json_bytes(raw, lambda m, e=ZOO_EDITS[op[1]]: e(m, ctx.marker))
        elif op[0] == "json":
            raw = mutate_json_bytes(raw, op[1], ctx.marker)
        else:
            for byte_op in op[1]:
                raw = apply_bytes(raw, byte_op)
    digest = None
    if forge:
        try:
            doc = json.loads(raw)
            if isinstance(doc, dict):
                doc["digest"] = digest = manifest_digest(doc)
                raw = dump_json(doc)
        except Exception:  # noqa: BLE001 - not a document the attacker can re-digest: keep the raw bytes
            digest = None
    path.write_bytes(raw)
    if forge:
        db = sqlite3.connect(str(zoo / "index.sqlite"))
        with db:
            db.execute("UPDATE versions SET manifest_sha256=?" + (", digest=?" if digest else "")
                       + " WHERE name='m' AND version='1'",
                       (hashlib.sha256(raw).hexdigest(), *((digest,) if digest else ())))
        db.close()


ZOO_SEEDS = {
    "zoo: healthy": ([], False),
    **{f"zoo: {key}, forged": ([("edit", key)], True) for key in ZOO_EDITS},
    "zoo: callable subprocess:call, not forged": ([("edit", "callable subprocess:call")], False),
    "zoo: deep nesting, forged": ([("json", [("set", 2, 24)])], True),
    "zoo: unknown keys, forged, tolerated": ([("json", [("add_key", 0, 0, 25), ("add_key", 0, 3, 2)])], True),
    "zoo: not JSON, forged": ([("bytes", [("truncate", 7)])], True),
}
