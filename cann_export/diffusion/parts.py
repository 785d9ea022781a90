"""A pipeline directory's model parts, each loaded on its own before diffusers assembles the pipeline, under the
rules a single model's directory is loaded by (hf/model.py): a part's config is first built on the meta device (no
memory) and refused when it describes far more elements than the part's safetensors hold (a config that does not
belong to its weights, or one integer that would allocate gigabytes); then the part is loaded with its loading
info and refused when weights are missing from the files (diffusers and transformers fill those with random values
and only warn, and the exported graph would compute with them). Before any of it, every file of a part's folder
is bounded and its configs read strictly (``check_files``); the tokenizers are checked once the pipeline is
built (``check_assembled``)."""
from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

from ..errors import ExportError, LoadError, gist

MODEL_CLASSES = {"SD3Transformer2DModel", "UNet2DConditionModel", "AutoencoderKL", "CLIPTextModel",
                 "CLIPTextModelWithProjection", "T5EncoderModel"}
MAX_MODEL_LENGTH = 1 << 16  # a tokenizer's model_max_length past this is transformers' "no limit" default (1e30)
MAX_TIMESTEPS = 100_000  # a scheduler's num_train_timesteps (1000 in every released pipeline)
# config values the assembled loop computes with: a number each (shift_factor may be null)
NUMBERS = {"vae": ("scaling_factor", "shift_factor"), "scheduler": ("num_train_timesteps",)}
_FIX = "restore the part's own files from the model's snapshot, or re-save the pipeline with pipe.save_pretrained(DIR)"


def check_files(directory: Path, parts: dict[str, tuple[str, str]]) -> None:
    """Every file of each part's folder that the load reads within its bound (a config 1 MiB, an index or a
    tokenizer's vocabulary MAX_FILE; other files, such as a full snapshot's .bin / .msgpack / .onnx weights, are never
    opened), each config a strict JSON object: a transformers part's under a model directory's rules
    (hf/config_json.read_config), a diffusers model's integers and lists bounded, the loop's numbers checked."""
    from ..hf.config_json import MAX_CONFIG_BYTES, read_config
    from .files import CONFIGS, MAX_FILE, TOKENIZER_FILES, read_json

    for name, (library, klass) in parts.items():
        folder = directory / name
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            read = path.name in (*CONFIGS, *TOKENIZER_FILES) or path.name.endswith(".safetensors.index.json")
            limit = MAX_CONFIG_BYTES if path.name in CONFIGS else MAX_FILE
            if read and path.is_file() and path.stat().st_size > limit:
                raise LoadError(f"{name}/{path.name} is larger than {limit >> 20} MiB, far past any pipeline's; "
                                f"refused unread; {_FIX}", path=path)
        if library == "transformers" and klass in MODEL_CLASSES:
            read_config(folder, trust_remote_code=False)
            continue
        for config_name in CONFIGS:
            if (folder / config_name).exists():
                where = folder / config_name
                config = read_json(where, f"{name}/{config_name}", _FIX, MAX_CONFIG_BYTES)
                if klass in MODEL_CLASSES:
                    _check_bounds(name, config, where)
                check_numbers(name, config, where)


MAX_INT, MAX_LIST, MAX_LAYERS = 1 << 17, 64, 1 << 10  # a diffusers model config's integers, lists, layer counts
LAYER_KEYS = ("num_layers", "layers_per_block", "transformer_layers_per_block", "num_single_layers")


def _check_bounds(name: str, config: dict[str, Any], where: Path) -> None:
    """A diffusers model's config builds what its integers say (on the meta device first, then for real): each
    integer at most MAX_INT (layer counts MAX_LAYERS), each list at most MAX_LIST long."""
    def walk(key: str, value: Any) -> None:
        bound = MAX_LAYERS if key in LAYER_KEYS else MAX_INT
        if isinstance(value, list):
            if len(value) > MAX_LIST and not all(isinstance(v, str) for v in value):
                raise LoadError(f"{name}/config.json's {key} is a list of {len(value)}, past the {MAX_LIST} any "
                                f"{name} config has; {_FIX}", path=where)
            for item in value:
                walk(key, item)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > bound:
            raise LoadError(f"{name}/config.json's {key} is {value}, past the {bound} any {name} config has; {_FIX}",
                            path=where)

    for key, value in config.items():
        if not key.startswith("_"):  # diffusers' own bookkeeping (_use_default_values: names)
            walk(key, value)


def check_numbers(name: str, config: dict[str, Any], where: Path, fix: str = _FIX) -> None:
    """The values of ``name``'s config the loop computes with (NUMBERS) are numbers, within bounds."""
    for key in NUMBERS.get(name, ()):
        value = config.get(key)
        if key not in config or (value is None and key == "shift_factor"):
            continue
        bad = not isinstance(value, numbers.Real) or isinstance(value, bool) or value != value
        if key == "num_train_timesteps":
            bad = bad or not isinstance(value, int) or not 0 < value <= MAX_TIMESTEPS
        if bad:
            raise LoadError(f"{name}/{where.name} sets {key} to {json.dumps(value)[:40]}, which the pipeline's loop "
                            f"cannot compute with; {fix}", path=where)


def load_parts(directory: Path, parts: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """``{part: module}`` for the model parts of ``parts`` (model_index.json's, checked), each checked as above."""
    return {name: _load(directory / name, name, library, klass) for name, (library, klass) in parts.items()
            if klass in MODEL_CLASSES}


def _load(folder: Path, name: str, library: str, klass: str) -> Any:
    import torch

    cls = getattr(__import__(library), klass)
    _check_size(folder, name, library, cls)
    kwargs: dict[str, Any] = {"local_files_only": True, "use_safetensors": True, "output_loading_info": True,
                              _dtype_keyword(library): torch.float32}
    try:
        model, info = cls.from_pretrained(str(folder), **kwargs)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's refusal of the user's files, named with the part
        raise LoadError(f"{library} could not load {name}/ as {klass} ({gist(e, 300)}); {_FIX}", path=folder) from e
    missing = sorted((info or {}).get("missing_keys") or []) if isinstance(info, dict) else []
    if missing:
        from ..hf.model import shown_keys

        raise LoadError(f"{len(missing)} weight(s) of {name} ({klass}) are not in {name}/'s weight files "
                        f"({shown_keys(missing)}): "
                        f"{library} would fill them with random values and the exported graph would compute with "
                        f"them. {name}/config.json describes weights the files lack; {_FIX}", path=folder)
    return model


def _dtype_keyword(library: str) -> str:
    """transformers took ``dtype`` from 4.56 (``torch_dtype`` before, deprecated after); diffusers ``torch_dtype``."""
    if library != "transformers":
        return "torch_dtype"
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _check_size(folder: Path, name: str, library: str, cls: Any) -> None:
    import torch

    from ..hf.model import past_the_weights
    from ..hf.weights import check_safetensors, stored_elements

    from .files import WEIGHT_FILE

    files = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" and p.is_file()  # not a variant's
                   and WEIGHT_FILE.fullmatch(p.name))
    stored = stored_elements([check_safetensors(p) for p in files])  # each header bounded and strict
    try:
        if library == "diffusers":
            config = cls.load_config(str(folder), local_files_only=True)
            with torch.device("meta"):
                model = cls.from_config(config)
        else:
            config = cls.config_class.from_pretrained(str(folder), local_files_only=True)
            with torch.device("meta"):
                model = cls._from_config(config)
    except Exception as e:  # noqa: BLE001 - the library's refusal of the config, named with the file
        raise LoadError(f"{library} cannot build {cls.__name__} from {name}/config.json ({gist(e, 300)}); {_FIX}",
                        path=folder / "config.json") from e
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    needed = sum(t.numel() for t in tensors.values())
    if past_the_weights(needed, stored):
        raise LoadError(f"{name}/config.json describes a {cls.__name__} of {needed:,} elements but {name}/'s weight "
                        f"files hold {stored:,}: the config does not belong to these weights (the rest would be "
                        f"random, or allocated for nothing); {_FIX}", path=folder / "config.json")


def check_assembled(pipe: Any, directory: Path) -> None:
    """The loaded pipeline's CLIP tokenizers: one whose folder lacks tokenizer_config.json pads prompts to
    transformers' 1e30 default length (a T5's prompts are padded to the pipeline's max_sequence_length)."""
    for name, part in pipe.components.items():
        if "tokenizer" in name and part is not None and not type(part).__name__.startswith("T5"):
            length = getattr(part, "model_max_length", None)
            if not (isinstance(length, int) and 0 < length <= MAX_MODEL_LENGTH):
                raise LoadError(f"{name}/ gives no usable model_max_length ({str(length)[:40]}): its "
                                "tokenizer_config.json is missing or does not set it, and the pipeline pads every "
                                f"prompt to it; {_FIX}", path=directory / name)
