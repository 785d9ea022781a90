"""The weight files of a model directory, checked before transformers reads them: safetensors (one file, or
shards listed by ``model.safetensors.index.json``) whose headers must account for every byte; pickled
``pytorch_model.bin`` only with --trust-pickle."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from ..errors import LoadError
from .config import read_json

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
    from .files import WEIGHT_NAMES, check_inside

    if (directory / ADAPTER).exists() or (directory / ADAPTER).is_symlink():
        raise LoadError(f"the directory holds a peft adapter ({ADAPTER}), whose base model and adapter weights "
                        "transformers would load past these checks; refused. Merge the adapter into the model "
                        "(peft's merge_and_unload) and save_pretrained the result", path=directory / ADAPTER)
    for name in WEIGHT_NAMES:  # the index files are read too: none may link out
        if (directory / name).exists() or (directory / name).is_symlink():
            check_inside(directory / name, roots)
    safetensors, weights = weight_files(directory, trust_pickle)
    for weight in weights:
        check_inside(weight, roots)
    return safetensors, weights


def weight_files(directory: Path, trust_pickle: bool) -> tuple[bool, list[Path]]:
    """(safetensors?, the weight files) in transformers' own order (the file checked is the file it loads):
    model.safetensors, its index, then pytorch_model.bin, its index; pickled files refused unless
    ``trust_pickle``."""
    if (directory / SAFE).exists():
        return True, [check_safetensors(directory / SAFE)]
    if (directory / SAFE_INDEX).exists():
        return True, [check_safetensors(p) for p in _shards(directory, SAFE_INDEX, ".safetensors")]
    pickled = [directory / n for n in (PICKLED, PICKLED_INDEX) if (directory / n).exists()]
    if pickled:
        if not trust_pickle:
            raise LoadError(f"the weights are a pickled checkpoint ({pickled[0].name}) and no model.safetensors is "
                            "there; unpickling can run code from the file. Pass --trust-pickle (trust_pickle=True) "
                            "if you trust it (transformers still loads it with weights_only=True), or re-save the "
                            "model with save_pretrained(..., safe_serialization=True)", path=pickled[0])
        if pickled[0].name == PICKLED_INDEX:
            return False, _shards(directory, PICKLED_INDEX, ".bin")
        return False, [_regular(pickled[0])]
    raise LoadError(f"no weights: the directory has config.json but neither {SAFE}, {SAFE_INDEX} nor {PICKLED}. "
                    "Copy the weight files next to config.json (save_pretrained writes them), or pass the "
                    "snapshot directory that holds them", path=directory)


def _regular(path: Path) -> Path:
    from ..fs.regular import check_regular_file

    check_regular_file(path, "weights file", "copy the model's weight files back (save_pretrained writes them)")
    return path


def _shards(directory: Path, index_name: str, suffix: str) -> list[Path]:
    index = read_json(directory / index_name, index_name, MAX_INDEX)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise LoadError(f"{index_name} has no weight_map object (tensor name -> shard file); re-save the model with "
                        "save_pretrained", path=directory / index_name)
    names = sorted(set(weight_map.values()), key=str)
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
    return [_regular(directory / n) for n in names]


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


def check_safetensors(path: Path) -> Path:
    """``path`` when its safetensors header is readable and its tensors end exactly at the end of the file
    (a truncated copy is refused here, naming the file, before transformers maps it)."""
    _regular(path)
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
            header = json.loads(f.read(length).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise LoadError(f"{path.name}'s safetensors header is not valid JSON; {hint}", path=path) from e
    if not isinstance(header, dict):
        raise LoadError(f"{path.name}'s safetensors header is not an object; {hint}", path=path)
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise LoadError(f"{path.name}: tensor {name[:80]!r} has no valid data_offsets; {hint}", path=path)
        end = max(end, offsets[1])
    if 8 + length + end != size:
        raise LoadError(f"{path.name} holds {size} bytes but its tensors need {8 + length + end}: {hint}", path=path)
    return path
