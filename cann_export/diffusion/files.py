"""The pipeline files a bundle carries under ``pipeline/`` (what the runner rebuilds the pipeline from, without
weights): ``model_index.json``, the scheduler's config, each tokenizer's files and each model part's config;
an atc_ready bundle also carries each part's safetensors (source_weights.py) and the end-to-end check's images
(e2e_images.py). Names are an allow-list; every file is bounded."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import LoadError

PIPELINE_DIR = "pipeline"
MODEL_INDEX = "model_index.json"
PART = re.compile(r"[a-z][a-z0-9_]{0,63}")
CONFIGS = ("config.json", "scheduler_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "spiece.model", "added_tokens.json")
MAX_FILE = 64 << 20  # a tokenizer.json of a large vocabulary is tens of MB
# the source weights a bundle may carry (source_weights.py): what save_pretrained writes, sharded past its limit
WEIGHT_FILE = re.compile(r"(model|diffusion_pytorch_model)((-\d{5}-of-\d{5})?\.safetensors|\.safetensors\.index\.json)")
IMAGE_FILE = re.compile(r"images/(eager|fp32|device)\.png")  # the end-to-end check's images (e2e_images.py)


def allowed(rel: str) -> bool:
    """Whether ``rel`` (a bundle path) is a pipeline file a bundle may carry."""
    parts = rel.split("/")
    if parts[0] != PIPELINE_DIR:
        return False
    if len(parts) == 2:
        return parts[1] == MODEL_INDEX
    if len(parts) != 3 or not PART.fullmatch(parts[1]):
        return False
    return parts[2] in (*CONFIGS, *TOKENIZER_FILES) or bool(WEIGHT_FILE.fullmatch(parts[2])) \
        or bool(IMAGE_FILE.fullmatch(f"{parts[1]}/{parts[2]}"))


def pipeline_files(pipe: Any, model_index: bytes | None = None) -> dict[str, bytes]:
    """``{"pipeline/...": bytes}`` for ``pipe``: ``model_index`` as given (a directory's own file) or from the
    pipeline's config; the scheduler's and each model part's config; each tokenizer's files."""
    import tempfile

    files: dict[str, bytes] = {}
    # diffusers' own model_index.json text (its _class_name and _diffusers_version with the parts)
    index = model_index if model_index is not None else pipe.to_json_string().encode()
    files[f"{PIPELINE_DIR}/{MODEL_INDEX}"] = index
    for name, part in pipe.components.items():
        if part is None or not PART.fullmatch(name):
            continue
        if name == "scheduler":
            files[f"{PIPELINE_DIR}/scheduler/scheduler_config.json"] = part.to_json_string().encode()
        elif hasattr(part, "save_pretrained") and "tokenizer" in name:
            with tempfile.TemporaryDirectory() as tmp:
                part.save_pretrained(tmp)
                for f in TOKENIZER_FILES:
                    if (Path(tmp) / f).is_file():
                        files[f"{PIPELINE_DIR}/{name}/{f}"] = (Path(tmp) / f).read_bytes()
        elif hasattr(part, "config"):
            config = part.config
            text = config.to_json_string() if hasattr(config, "to_json_string") else part.to_json_string()
            files[f"{PIPELINE_DIR}/{name}/config.json"] = text.encode()
    return files


def read_json(path: Path, what: str, fix: str = "restore the pipeline's own file (pipe.save_pretrained(DIR) writes "
              "it)", limit: int = MAX_FILE) -> dict[str, Any]:
    """A JSON object from ``path`` (at most ``limit`` bytes, strict but for a scheduler config's infinities, which
    diffusers writes), else a LoadError naming ``what`` and ``fix``."""
    from ..fs.jsonio import loads_strict

    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise LoadError(f"{what} cannot be read ({e.strerror}); {fix}", path=path) from e
    if len(data) > limit:
        raise LoadError(f"{what} is larger than {limit >> 20 or 1} MiB; it is not a pipeline's file; {fix}", path=path)
    try:
        value = loads_strict(data.decode("utf-8"), infinities=path.name == "scheduler_config.json")
    except RecursionError as e:
        raise LoadError(f"{what} nests too deeply to be a pipeline's file; {fix}", path=path) from e
    except (ValueError, UnicodeDecodeError) as e:
        raise LoadError(f"{what} is not valid JSON ({str(e)[:120]}); {fix}", path=path) from e
    if not isinstance(value, dict):
        raise LoadError(f"{what} is not a JSON object; {fix}", path=path)
    return value
