"""The pipeline files a bundle carries under ``pipeline/`` (what the runner rebuilds the pipeline from, without
weights): ``model_index.json``, the scheduler's config, each tokenizer's files and each model part's config.
Names are an allow-list; every file is bounded."""
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


def allowed(rel: str) -> bool:
    """Whether ``rel`` (a bundle path) is a pipeline file a bundle may carry."""
    parts = rel.split("/")
    if parts[0] != PIPELINE_DIR:
        return False
    if len(parts) == 2:
        return parts[1] == MODEL_INDEX
    return len(parts) == 3 and bool(PART.fullmatch(parts[1])) and parts[2] in (*CONFIGS, *TOKENIZER_FILES)


def pipeline_files(pipe: Any, model_index: bytes | None = None) -> dict[str, bytes]:
    """``{"pipeline/...": bytes}`` for ``pipe``: ``model_index`` as given (a directory's own file) or from the
    pipeline's config; the scheduler's and each model part's config; each tokenizer's files."""
    import tempfile

    from ..fs.jsonio import dumps

    files: dict[str, bytes] = {}
    index = model_index if model_index is not None else dumps(_plain(dict(pipe.config))).encode()
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


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` (at most MAX_FILE bytes, strict)."""
    from ..fs.jsonio import loads_strict

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as e:
        raise LoadError(f"{what} cannot be read ({e.strerror})", path=path) from e
    if len(data) > MAX_FILE:
        raise LoadError(f"{what} is larger than {MAX_FILE >> 20} MiB; it is not a pipeline's file", path=path)
    try:
        value = loads_strict(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise LoadError(f"{what} is not valid JSON ({str(e)[:120]})", path=path) from e
    if not isinstance(value, dict):
        raise LoadError(f"{what} is not a JSON object", path=path)
    return value
