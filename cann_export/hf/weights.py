"""The weight files of a model directory, checked before transformers reads them: safetensors (one file, or
shards listed by ``model.safetensors.index.json``) whose headers must account for every byte; pickled
``pytorch_model.bin`` only with --trust-pickle."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from typing import Any

from ..errors import LoadError
from ..fs.jsonio import loads_strict as strict_json
from .config_json import read_json

SAFE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED, PICKLED_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
MAX_INDEX = 64 << 20


ADAPTER = "adapter_config.json"


def checked_weights(directory: Path, roots: list[Path], trust_pickle: bool) -> tuple[bool, list[Path]]:
    """``weight_files`` of a resolved model directory (``files.resolve``), every weight and index file inside
    ``roots``: the one check every loader of a directory runs before ``from_pretrained``. A peft adapter
    (``adapter_config.json``: transformers would load its base model and adapter weights unchecked) is refused."""
    from .directory_files import WEIGHT_NAMES, check_inside

    if (directory / ADAPTER).exists() or (directory / ADAPTER).is_symlink():
        raise LoadError(f"the directory holds a peft adapter ({ADAPTER}), whose base model and adapter weights "
                        "transformers would load past these checks; refused. Merge the adapter into the model "
                        "(peft's merge_and_unload) and save_pretrained the result", path=directory / ADAPTER)
    for name in WEIGHT_NAMES:  # the index files are read too: none may link out
        if (directory / name).exists() or (directory / name).is_symlink():
            check_inside(directory / name, roots)
    return weight_files(directory, trust_pickle, roots)


def weight_files(directory: Path, trust_pickle: bool, roots: list[Path] | None = None) -> tuple[bool, list[Path]]:
    """(safetensors?, the weight files) in transformers' own order (the file checked is the file it loads):
    model.safetensors, its index, then pytorch_model.bin, its index; pickled files refused unless
    ``trust_pickle``. ``roots``: where every file must lie, checked before it is opened."""
    from .directory_files import check_inside

    def inside(path: Path) -> Path:
        return check_inside(path, roots) if roots is not None else path

    if (directory / SAFE).exists():
        return True, [check_safetensors(inside(directory / SAFE))]
    if (directory / SAFE_INDEX).exists():
        shards, weight_map = _shards(directory, SAFE_INDEX, ".safetensors", inside)
        for shard in shards:
            _check_weight_map(directory / SAFE_INDEX, weight_map, shard.name, tensor_names(check_safetensors(shard)))
        return True, shards
    pickled = [directory / n for n in (PICKLED, PICKLED_INDEX) if (directory / n).exists()]
    if pickled:
        if not trust_pickle:
            raise LoadError(f"the weights are a pickled checkpoint ({pickled[0].name}) and no model.safetensors is "
                            "there; unpickling can run code from the file. Pass --trust-pickle (trust_pickle=True) "
                            "if you trust it (transformers still loads it with weights_only=True), or re-save the "
                            "model with save_pretrained(..., safe_serialization=True)", path=pickled[0])
        if pickled[0].name == PICKLED_INDEX:
            return False, _shards(directory, PICKLED_INDEX, ".bin", inside)[0]
        return False, [_regular(inside(pickled[0]))]
    raise LoadError(f"no weights: the directory has config.json but neither {SAFE}, {SAFE_INDEX} nor {PICKLED}. "
                    "Copy the weight files next to config.json (save_pretrained writes them), or pass the "
                    "snapshot directory that holds them", path=directory)


def _regular(path: Path) -> Path:
    from ..fs.regular import check_regular_file

    check_regular_file(path, "weights file", "copy the model's weight files back (save_pretrained writes them)")
    return path


def _shards(directory: Path, index_name: str, suffix: str, inside: Any) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names (each a plain name in the directory, inside it, present) and its map."""
    index = read_json(inside(directory / index_name), index_name, MAX_INDEX)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise LoadError(f"{index_name} has no weight_map object (tensor name -> shard file); re-save the model with "
                        "save_pretrained", path=directory / index_name)
    odd = next((k for k, v in weight_map.items() if not isinstance(v, str)), None)
    if odd is not None:
        raise LoadError(f"{index_name}'s weight_map maps {odd[:80]!r} to {json.dumps(weight_map[odd])[:80]}, not a "
                        "shard file name; re-save the model with save_pretrained", path=directory / index_name)
    names = sorted(set(weight_map.values()))
    for name in names:
        if not isinstance(name, str) or not SHARD.fullmatch(name) or not name.endswith(suffix) or ".." in name:
            raise LoadError(f"{index_name} names the shard {json.dumps(name)[:80]}, not a plain *{suffix} file name "
                            "in the directory (refused, nothing read); re-save the model with save_pretrained",
                            path=directory / index_name)
    missing = [n for n in names if not (directory / n).exists()]
    if missing:
        raise LoadError(f"{index_name} lists {len(names)} shards but {', '.join(missing[:4])} "
                        f"{'is' if len(missing) == 1 else 'are'} missing; copy every shard next to the index "
                        "(an interrupted download or copy)", path=directory / missing[0])
    return [_regular(inside(directory / n)) for n in names], weight_map


def _check_weight_map(index: Path, weight_map: dict[str, str], shard: str, held: set[str]) -> None:
    """A shard holds exactly the tensors the index maps to it: a tensor in two shards, or one the index does not
    map there, would load from a file other than the one the index names."""
    mapped = {k for k, v in weight_map.items() if v == shard}
    if held != mapped:
        extra, lacking = sorted(held - mapped), sorted(mapped - held)
        what = (f"holds {extra[0][:80]!r}, which the index maps elsewhere" if extra
                else f"lacks {lacking[0][:80]!r}, which the index maps to it")
        raise LoadError(f"{shard} {what} ({len(extra)} extra, {len(lacking)} missing); the shards do not match "
                        f"{index.name}, so a weight could load from the wrong file. Re-save the model with "
                        "save_pretrained", path=index)


def stored_elements(paths: list[Path]) -> int:
    """The number of tensor elements the safetensors files hold (from their headers, checked by
    ``check_safetensors``)."""
    total = 0
    for path in paths:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length).decode("utf-8"))
        for name, entry in header.items():
            shape = entry.get("shape") if name != "__metadata__" and isinstance(entry, dict) else None
            if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
                count = 1
                for d in shape:
                    count *= d
                total += count
    return total


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2,
               "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
               "F8_E5M2FNUZ": 1, "C64": 8, "C128": 16}
PACKED = ("F4", "F6_E2M3", "F6_E3M2", "I4", "U4")  # sub-byte: a packed (quantized) checkpoint


def _header(path: Path) -> tuple[int, dict[str, Any]]:
    """(header length, header) of a safetensors file, bounded and strict JSON (no NaN, no duplicate names)."""
    size = path.stat().st_size
    hint = "the file is truncated or not safetensors; copy or download it again"
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LoadError(f"{path.name} is {size} bytes, too short for a safetensors header; {hint}", path=path)
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER or 8 + length > size:
            raise LoadError(f"{path.name}'s header claims {length} bytes but the file has {size}; {hint}", path=path)
        try:
            header = strict_json(f.read(length).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise LoadError(f"{path.name}'s safetensors header is not valid JSON ({e}); {hint}", path=path) from e
    if not isinstance(header, dict):
        raise LoadError(f"{path.name}'s safetensors header is not an object; {hint}", path=path)
    return length, header


def check_safetensors(path: Path) -> Path:
    """``path`` when its safetensors header is well formed (a known dtype, a shape of sizes, offsets that cover the
    data once: no overlap, no gap, each tensor's bytes its shape times its dtype) and its tensors end exactly at
    the end of the file (a truncated or crafted copy is refused here, naming the file, before transformers maps
    it)."""
    _regular(path)
    size = path.stat().st_size
    length, header = _header(path)
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise LoadError(f"{path.name}: its __metadata__ is not a map of strings; {_CRAFTED}", path=path)
            continue
        problem = _entry_problem(entry)
        if problem:
            raise LoadError(f"{path.name}: tensor {name[:80]!r} {problem}; {_CRAFTED}", path=path)
        spans.append((entry["data_offsets"][0], entry["data_offsets"][1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise LoadError(f"{path.name}: tensor {name[:80]!r} starts at byte {begin}, not {end} where the one "
                            f"before it ends (an overlap or a gap); {_CRAFTED}", path=path)
        end = stop
    if 8 + length + end != size:
        raise LoadError(f"{path.name} holds {size} bytes but its tensors need {8 + length + end}: the file is "
                        "truncated or not safetensors; copy or download it again", path=path)
    return path


_CRAFTED = "the file is damaged or crafted; copy or download it again, or re-save the model with save_pretrained"


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype in PACKED:
        return (f"has the packed dtype {dtype} of a quantized checkpoint, which cann-export does not load (export "
                "the float model)")
    if dtype not in DTYPE_BYTES:
        return f"has dtype {json.dumps(dtype)[:40]}, not a safetensors dtype cann-export reads"
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return "has no shape of non-negative sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return "has no valid data_offsets [begin, end]"
    count = 1
    for d in shape:
        count *= d
    if offsets[1] - offsets[0] != count * DTYPE_BYTES[dtype]:
        return f"spans {offsets[1] - offsets[0]} bytes, not the {count * DTYPE_BYTES[dtype]} its shape and dtype need"
    return None


def tensor_names(path: Path) -> set[str]:
    """The tensor names of a checked safetensors file."""
    return {name for name in _header(path)[1] if name != "__metadata__"}
