"""The members a genuine archive of each kind holds, learned from torch 2.13's own writers: torch.export.save
(torch/export/pt2_archive/_package.py and constants.py), torch.jit.save and torch.save's zip layout.

Every name sits under one top directory (torch's readers take the first entry's as the archive root). Which
members are raw tensor payloads (bytes torch copies into a storage, never parses) and which torch parses
(JSON, pickles, TorchScript code) decides how the re-pack copies them (load/repack.py). Anything else is
refused by name, unless the user trusts the file.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

PT2, TORCHSCRIPT, TORCH_SAVE = "torch.export", "torchscript", "torch.save"
WRITERS = {PT2: "torch.export.save", TORCHSCRIPT: "torch.jit.save", TORCH_SAVE: "torch.save"}
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_RECORDS = r"(?:version|\.data/version|byteorder|\.data/serialization_id)"
_ALLOWED = {
    PT2: re.compile(rf"{_RECORDS}|archive_format|archive_version|models/{_NAME}\.json|data/sample_inputs/{_NAME}\.pt"
                    rf"|data/weights/{_NAME}_weights_config\.json|data/weights/weight_\d+"
                    rf"|data/constants/{_NAME}_constants_config\.json|data/constants/tensor_\d+|extra/{_NAME}"),
    TORCHSCRIPT: re.compile(rf"{_RECORDS}|(?:data|constants|traced_inputs)\.pkl|(?:data|constants|traced_inputs)/\d+"
                            rf"|code/(?:{_NAME}/)*{_NAME}\.py(?:\.debug_pkl)?|extra/{_NAME}"),
    TORCH_SAVE: re.compile(rf"{_RECORDS}|\.format_version|\.storage_alignment|data\.pkl|data/\d+"),
}
_PAYLOADS = {PT2: re.compile(r"data/(?:weights/weight|constants/tensor)_\d+"),
             TORCHSCRIPT: re.compile(r"(?:data|constants|traced_inputs)/\d+"),
             TORCH_SAVE: re.compile(r"data/\d+")}
_OBJECTS = re.compile(r"data/constants/(custom_obj|opaque_obj)_\d+")
_NATIVE = re.compile(r"(^|/)data/aotinductor/|\.(so|dylib|dll|pyd)(\.\d+)*$", re.IGNORECASE)
_SHOWN = 5


@dataclass(frozen=True)
class Pt2Layout:
    """torch.export.save's record names (torch/export/pt2_archive/constants.py), here because importing torch's
    module imports torch.export's serializer and dynamo (seconds) where checking an archive needs five strings;
    tests/load/test_archive_layout.py checks them against the installed torch's."""
    MODELS_FILENAME_FORMAT: str = "models/{}.json"
    SAMPLE_INPUTS_FILENAME_FORMAT: str = "data/sample_inputs/{}.pt"
    WEIGHTS_CONFIG_FILENAME_FORMAT: str = "data/weights/{}_weights_config.json"
    CONSTANTS_CONFIG_FILENAME_FORMAT: str = "data/constants/{}_constants_config.json"
    WEIGHTS_DIR: str = "data/weights/"
    CONSTANTS_DIR: str = "data/constants/"


PT2_LAYOUT = Pt2Layout()


def root_of(names: list[str]) -> str:
    """The archive root torch's reader uses: the first entry's top directory ('' when it has none)."""
    return names[0].split("/", 1)[0] if names and "/" in names[0] else ""


def refusal(kind: str, names: list[str]) -> str | None:
    """Why the archive holds members ``WRITERS[kind]`` does not write (each named), or None."""
    root = root_of(names)
    native, objects, foreign = [], [], []
    for name in names:
        record = name[len(root) + 1:] if root and name.startswith(root + "/") else None
        if _NATIVE.search(name):
            native.append(name)
        elif record is not None and _OBJECTS.fullmatch(record):
            objects.append(name)
        elif record is None or not _ALLOWED[kind].fullmatch(record):
            foreign.append(name)
    if native:
        return (f"{_listed(native)} native code (AOTInductor or a shared object) that torch.export.load would "
                "extract and dlopen(), running it; export the model without AOTInductor packaging")
    if objects:
        return (f"{_listed(objects)} a Python object constant (torchbind / opaque object), which torch restores "
                "with full unpickling")
    if foreign:
        where = f"under its top directory {root!r}" if root else "under one top directory"
        return (f"{_listed(foreign)} not among the members {WRITERS[kind]} writes {where}: a crafted or foreign "
                f"archive. Re-create it with {WRITERS[kind]}")
    return None


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n[:120]) for n in names[:_SHOWN]) + (f" (+{len(names) - _SHOWN} more)"
                                                                 if len(names) > _SHOWN else "")
    return f"archive member {shown} is" if len(names) == 1 else f"archive members {shown} are"


def is_payload(kind: str, record: str) -> bool:
    """A raw tensor payload (copied into a storage, never parsed), judged by its name alone."""
    return bool(_PAYLOADS[kind].fullmatch(record))


def pickled_payloads(configs: dict[str, bytes]) -> set[str]:
    """The pt2 records that a weights/constants config (record -> its JSON) marks ``use_pickle``: torch
    unpickles them, so they are read and checked like any other pickle."""
    found = set()
    for record, data in configs.items():
        directory = record.rsplit("/", 1)[0]
        try:
            entries = json.loads(data).get("config", {})
        except (ValueError, AttributeError, RecursionError):
            continue  # torch fails on it before reading a payload
        for entry in entries.values() if isinstance(entries, dict) else ():
            if isinstance(entry, dict) and entry.get("use_pickle"):
                found.add(f"{directory}/{entry.get('path_name', '')}")
    return found


def is_config(kind: str, record: str) -> bool:
    return kind == PT2 and record.startswith("data/") and record.endswith("_config.json")
