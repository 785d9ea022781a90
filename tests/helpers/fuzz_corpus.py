"""The crafted cases of issue 16, as the fuzzer's seed corpus: model files (each .pt2 member torch would
unpickle, guards_code, AOTInductor shared objects, M + Z, a NUL in a name, sympy calls, file-reading node
targets, zip name and size tricks, hostile torch.save and safetensors files), each built from a real
artifact. ``model_seeds`` returns ``{label: (path, hostile)}``; a hostile seed must be refused."""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from . import files
from .files import evil_bytes, rewrite
from .fuzz_mutations import central_records
from .fuzz_payloads import Context, python_code, safetensors_bytes

PICKLE_KINDS = ("protocol0", "protocol1", "protocol2", "legacy torch.save", "torch.save zip")


def _member(pt2: Path, suffix: str) -> tuple[str, bytes]:
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        return name, z.read(name)


def _model_json(pt2: Path, edit) -> dict[str, bytes]:
    doc = json.loads(_member(pt2, "models/model.json")[1])
    edit(doc)
    return {"models/model.json": json.dumps(doc).encode()}


def _first_node(doc: dict) -> dict:
    return doc["graph_module"]["graph"]["nodes"][0]


def _use_pickle_weight(good: Path, marker: Path, kind: str) -> dict[str, bytes]:
    cfg = json.loads(_member(good, "model_weights_config.json")[1])
    fqn = next(iter(cfg["config"]))
    cfg["config"][fqn]["use_pickle"] = True
    return {"model_weights_config.json": json.dumps(cfg).encode(),
            f"data/weights/{cfg['config'][fqn]['path_name']}": evil_bytes(marker, kind)}


def _constant(path_name: str) -> bytes:
    return json.dumps({"config": {"c0": {"path_name": path_name, "is_param": False, "use_pickle": True,
                                         "tensor_meta": None}}}).encode()


def _patched(path: Path, old: bytes, new: bytes, count: int = -1) -> Path:
    path.write_bytes(path.read_bytes().replace(old, new, count))
    return path


def _declared(path: Path, member: str, size: int) -> Path:
    raw = bytearray(path.read_bytes())
    cd = next(at for at in central_records(bytes(raw))
              if raw[at + 46:at + 46 + struct.unpack_from("<H", raw, at + 28)[0]].endswith(member.encode()))
    struct.pack_into("<I", raw, cd + 24, size)  # the central directory's uncompressed size
    path.write_bytes(bytes(raw))
    return path


def pt2_seeds(tmp: Path, marker: Path, good: Path) -> dict[str, tuple[Path, bool]]:
    seeds: dict[str, tuple[Path, bool]] = {"pt2: healthy": (good, False)}

    def add(label: str, replace: dict | None = None, extra: dict | None = None) -> Path:
        path = rewrite(good, tmp / f"seed{len(seeds)}.pt2", replace, extra)
        seeds[f"pt2: {label}"] = (path, True)
        return path

    for kind in PICKLE_KINDS:
        add(f"sample inputs, {kind}", {"sample_inputs/model.pt": evil_bytes(marker, kind)})
    for kind in ("protocol1", "legacy torch.save"):
        add(f"use_pickle weight, {kind}", _use_pickle_weight(good, marker, kind))
    add("legacy weights file", extra={"{root}/data/weights/model.pt": evil_bytes(marker, "protocol1")})
    add("legacy constants file", extra={"{root}/data/constants/model.pt": evil_bytes(marker, "protocol0")})
    for name in ("tensor_0", "opaque_obj_0"):
        add(f"use_pickle constant {name}", {"model_constants_config.json": _constant(name)},
            {f"{{root}}/data/constants/{name}": evil_bytes(marker, "protocol2")})
    add("torch 2.7 layout", extra={"version": b"8.0", "serialized_example_inputs.pt": evil_bytes(marker, "protocol1")})
    add("guards_code", _model_json(good, lambda d: d.update(guards_code=[python_code(marker)])))
    add("sympy call in the graph", _model_json(good, lambda d: _first_node(d)["metadata"].update(
        evil={"expr_str": python_code(marker)})))
    for target in ("torch.os.system", "torch.ops.aten.from_file.default", "torch.ops.aten.save.default"):
        add(f"node target {target}", _model_json(good, lambda d, t=target: _first_node(d).update(target=t)))
    _codegen_names(add, good, marker)
    add("AOTInductor .so", extra={"{root}/data/aotinductor/model/x.so": b"\x7fELF not really"})
    add("shared object elsewhere", extra={"{root}/extra/libpayload.so.1": b"\x7fELF not really"})
    dup = add("duplicate model.json", extra={"{root}/models/model.json": _model_json(
        good, lambda d: d.update(guards_code=[python_code(marker)]))["models/model.json"]})
    for name in ("../../escape", "/abs/path", "a\\..\\b"):
        add(f"member name {name!r}", extra={name: b"x"})
    _patched(add("NUL in a member name", extra={"{root}/extra/aXb": b"x"}), b"extra/aXb", b"extra/a\0b")
    _declared(add("3 GiB declared size", extra={"{root}/extra/big": b"z" * 64}), "extra/big", 3 << 30)
    versioned = add("zip version 6.4 in the directory", extra={"{root}/extra/v": b"x"})
    raw = bytearray(versioned.read_bytes())
    struct.pack_into("<H", raw, central_records(bytes(raw))[0] + 6, 64)  # version needed to extract: 6.4
    versioned.write_bytes(bytes(raw))
    both = tmp / "m_plus_z.pt2"
    both.write_bytes(Context(marker, good).evil_archive() + good.read_bytes())
    seeds["pt2: M + Z"] = (both, True)
    for label, data in (("trailing bytes", good.read_bytes() + bytes(8)),
                        ("shell prefix", b"#!/bin/sh\n" + good.read_bytes())):
        path = tmp / f"seed{len(seeds)}.pt2"
        path.write_bytes(data)
        seeds[f"pt2: {label}"] = (path, True)
    assert dup.is_file()
    return seeds


def _codegen_names(add, good: Path, marker: Path) -> None:
    """Names torch writes into the source it generates (issue 41): each would run ``python_code``."""
    code = python_code(marker)

    def call(doc: dict) -> dict:
        return doc["graph_module"]["module_call_graph"][0]["signature"]

    def spec_with(doc: dict, context: str) -> None:
        call(doc)["in_spec"] = json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [
            {"type": "builtins.tuple", "context": "null", "children_spec": []},
            {"type": "builtins.dict", "context": context, "children_spec": [
                {"type": None, "context": None, "children_spec": []}]}]}])

    add("keyword-input name", _model_json(good, lambda d: call(d).update(forward_arg_names=[f"x=({code})):#"])))
    add("in_spec kwargs key", _model_json(good, lambda d: spec_with(d, json.dumps([f"x=({code})"]))))
    add("in_spec enum context", _model_json(good, lambda d: spec_with(d, json.dumps(
        [{"__enum__": True, "fqn": "this:X", "name": "Y"}]))))
    add("node name", _model_json(good, lambda d: _first_node(d).update(name=f"y = ({code})")))
    add("parameter path", _model_json(good, lambda d: d["graph_module"]["signature"]["input_specs"][0][
        "parameter"].update(parameter_name=f'a")+str({code})+getattr(self, "b')))


def file_seeds(tmp: Path, marker: Path) -> dict[str, tuple[Path, bool]]:
    """torch.save and safetensors files: the healthy ones (loaded with ``--model-class``) and hostile ones."""
    seeds = {"state_dict": (files.state_dict(tmp), False), "checkpoint": (files.checkpoint(tmp), False),
             "safetensors": (files.safetensors_weights(tmp), False)}
    for kind in PICKLE_KINDS:
        path = tmp / f"evil_{kind.replace(' ', '_')}.pth"
        path.write_bytes(evil_bytes(marker, kind))
        seeds[f"torch.save: {kind}"] = (path, True)
    good = files.safetensors_weights(tmp).read_bytes()
    (length,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8:8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [0, 1 << 40]
    for label, data in (("huge header length", safetensors_bytes(b"{}", declared=1 << 62)),
                        ("header past the end", safetensors_bytes(b'{"a": 1}', declared=1 << 20)),
                        ("bad JSON header", safetensors_bytes(b"{not json")),
                        ("offsets out of range", safetensors_bytes(json.dumps(header).encode()) + good[8 + length:])):
        path = tmp / f"st_{len(seeds)}.safetensors"
        path.write_bytes(data)
        seeds[f"safetensors: {label}"] = (path, True)
    return seeds
