"""config.json of a model directory, read as hostile input: bounded size and depth, checked types and ranges,
remote code (``auto_map``) refused unless trusted. Nothing from the file is imported, called or opened."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import LoadError

MAX_CONFIG_BYTES = 1 << 20  # a real config.json is a few KB; a hostile one must not exhaust memory
MAX_DEPTH = 16
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
MODEL_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}")  # transformers' own have hyphens: vision-encoder-decoder
# integer fields the dummy inputs and the task read: each must be a positive int below its bound
INT_BOUNDS = {
    "vocab_size": 1 << 24, "max_position_embeddings": 1 << 22, "n_positions": 1 << 22, "type_vocab_size": 1 << 12,
    "image_size": 1 << 14, "num_channels": 1 << 10, "num_mel_bins": 1 << 12, "max_source_positions": 1 << 20,
    "patch_size": 1 << 14, "hidden_size": 1 << 20, "num_labels": 1 << 20, "sampling_rate": 1 << 22,
    # layer counts under every name a config uses (GPT-2's n_layer, T5's num_layers, ...): the size check builds
    # the model on the meta device, whose cost grows with the layers (20,000 of them: 110 s, 1.1 GB) before it
    # can refuse; the deepest real models have a few hundred
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers"), 1 << 10),
}
LAYER_LISTS = ("depths", "layer_types")  # Swin's per-stage depths; a hybrid model's per-layer kinds
ZERO_OK = ("type_vocab_size",)  # DeBERTa-v2/v3: 0, no token type embeddings
_HINT = "re-save it with transformers' save_pretrained"
# config.json keys that make from_pretrained load another weight file than the one checked (transformers 5's
# modeling_utils reads ``transformers_weights`` as the file to load, following links, past these checks)
REDIRECT_KEYS = ("transformers_weights",)
SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder")  # composite models' nested configs


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def read_json(path: Path, what: str, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from ``path``: at most ``limit`` bytes, nesting at most MAX_DEPTH, else a LoadError."""
    from ..fs.regular import check_regular_file

    check_regular_file(path, what, f"{what} must be a regular file; {_HINT}")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise LoadError(f"{path.name} is larger than {limit} bytes, far past any real {what}; refused unread. "
                        f"Check the directory holds the model's own {path.name} ({_HINT})", path=path)
    from ..fs.jsonio import loads_strict

    try:
        value = loads_strict(data.decode("utf-8"))
    except RecursionError as e:
        raise LoadError(f"{path.name} nests too deeply to be a {what}; {_HINT}", path=path) from e
    except (UnicodeDecodeError, ValueError) as e:
        raise LoadError(f"{path.name} is not valid JSON ({errors_gist(e)}); {_HINT}", path=path) from e
    if not isinstance(value, dict):
        raise LoadError(f"{path.name} must hold a JSON object, not {type(value).__name__}; {_HINT}", path=path)
    if _depth(value) > MAX_DEPTH:
        raise LoadError(f"{path.name} nests deeper than {MAX_DEPTH} levels, which no {what} does; {_HINT}",
                        path=path)
    return value


def errors_gist(e: BaseException) -> str:
    from ..errors import gist

    return gist(e, 160)


def read_config(directory: Path, trust_remote_code: bool) -> dict[str, Any]:
    """config.json of ``directory``, checked: ``model_type`` and ``architectures`` are identifiers, the integer
    fields in INT_BOUNDS are positive ints in range, and ``auto_map`` (remote code) needs ``trust_remote_code``."""
    path = directory / "config.json"
    config = read_json(path, "config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not MODEL_TYPE.fullmatch(model_type):
        raise LoadError(f"config.json's model_type is {_shown(model_type)}, not a transformers model type; {_HINT}",
                        path=path)
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not archs or len(archs) > 8
                              or not all(isinstance(a, str) and IDENT.fullmatch(a) for a in archs)):
        raise LoadError(f"config.json's architectures is {_shown(archs)}, not a list of class names such as "
                        f"[\"BertForSequenceClassification\"]; {_HINT}", path=path)
    sections = _sections(config, path)
    for prefix, section in sections:
        for key in REDIRECT_KEYS:
            if key in section:
                raise LoadError(f"config.json's {prefix}{key} ({_shown(section[key])}) makes "
                                "transformers load another weight file than model.safetensors, past this loader's "
                                f"checks; refused. Remove the field and keep the weights in model.safetensors "
                                f"({_HINT})", path=path)
        nested = section.get("model_type")
        if prefix and nested is not None and (not isinstance(nested, str) or not MODEL_TYPE.fullmatch(nested)):
            raise LoadError(f"config.json's {prefix}model_type is {_shown(nested)}, not a transformers model type; "
                            f"{_HINT}", path=path)
    for prefix, section in sections:
        for name, bound in INT_BOUNDS.items():
            value = section.get(name)
            if name in ("image_size", "patch_size") and isinstance(value, list) and 1 <= len(value) <= 3:
                value = max(value) if all(_int(v) and v > 0 for v in value) else value
            low = 0 if name in ZERO_OK else 1
            if value is not None and (not _int(value) or not low <= value <= bound):
                raise LoadError(f"config.json's {prefix}{name} is {_shown(value)}; it must be an integer from {low} "
                                f"up to {bound}. Fix the field or {_HINT}", path=path)
    for prefix, section in sections:
        for name in LAYER_LISTS:
            value = section.get(name)
            count = sum(value) if name == "depths" and isinstance(value, list) and all(
                _int(v) and v >= 0 for v in value) else len(value) if isinstance(value, list) else 0
            if count > 1 << 10:
                raise LoadError(f"config.json's {prefix}{name} describes {count} layers, past the {1 << 10} this "
                                f"loader builds; fix the field or {_HINT}", path=path)
    _refuse_quantized_or_kernels(sections, path)
    mapped = next((section for _, section in sections if "auto_map" in section), None)
    if mapped is not None and not trust_remote_code:
        raise LoadError("config.json has an auto_map: the model's classes are Python files in the directory "
                        f"({_shown(mapped['auto_map'])}), which would run on load. Pass --trust-remote-code "
                        "(trust_remote_code=True) only if you trust that code; it then runs inside the load sandbox",
                        path=path)
    return config


def _refuse_quantized_or_kernels(sections: list[tuple[str, dict]], path: Path) -> None:
    """A quantized checkpoint (``quantization_config``: bitsandbytes, GPTQ, AWQ, fp8, torchao) needs its
    quantizer's packages and kernels to load, and exports no float graph; a hub kernel (``attn_implementation``
    naming a repository) would be downloaded and run. Both refused, naming the field."""
    for prefix, section in sections:
        quant = section.get("quantization_config")
        if quant is not None:
            method = quant.get("quant_method") if isinstance(quant, dict) else None
            raise LoadError(f"config.json's {prefix}quantization_config ({_shown(method or quant)}) makes this a "
                            "quantized checkpoint, which cann-export does not load: export the float model (for int8 "
                            "on the NPU: --qat or --ptq with --calibration-data)", path=path)
        for key in ("attn_implementation", "_attn_implementation"):
            value = section.get(key)  # a name, or {sub-config: name} (transformers reads both)
            named = list(value.values()) if isinstance(value, dict) else [value]
            value = next((v for v in named if isinstance(v, str) and "/" in v), None)
            if value is not None:
                raise LoadError(f"config.json's {prefix}{key} is {_shown(value)}, a kernel from the Hugging Face Hub, "
                                "which would be downloaded and run; refused. Remove the field (PyTorch's own "
                                "attention is used)", path=path)


def _sections(config: dict[str, Any], path: Path, prefix: str = "", depth: int = 0) -> list[tuple[str, dict]]:
    """``config`` and its nested configs (``text_config``, a composite model's ``encoder`` / ``decoder``, and
    theirs: a vision encoder-decoder's encoder may be an encoder-decoder), each with its dotted prefix."""
    out = [(prefix, config)]
    for sub in SUB_CONFIGS:
        value = config.get(sub)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise LoadError(f"config.json's {prefix}{sub} is {_shown(value)}, not an object; {_HINT}", path=path)
        if depth >= 3:
            raise LoadError(f"config.json nests configs past {prefix}{sub} (more than 3 levels); {_HINT}", path=path)
        out += _sections(value, path, f"{prefix}{sub}.", depth + 1)
    return out


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."
