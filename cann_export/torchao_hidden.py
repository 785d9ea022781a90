"""torchao, hidden from a CLI export of a model directory, which cannot use it.

transformers (``quantizers/auto.py``) and diffusers import torchao with their model classes whenever it is
installed: 0.4-0.6 s and 13 MiB of every export in an environment that has it (this project's test extra brings
it), though only a torchao-quantized checkpoint uses it. A transformers directory or a diffusers pipeline runs the
libraries' own classes. Hidden means ``sys.modules["torchao"] = None``: ``importlib.util.find_spec`` answers None,
which both libraries' availability checks read when they are first imported (load/torchvision_pair.py hides a
broken torchvision the same way). torchao stays as it is when any of these holds:

- the process is not the CLI's own (``own_process``): the Python API runs in the caller's process, which may use
  torchao itself;
- transformers, diffusers or torchao is imported already (by a plugin, say): they have read torchao as there;
- the model is not a model directory this package reads (hf/directory_files.is_model_directory), or a third-party
  loader claims the directory: a file (a pickle or a .pt2 may hold torchao's modules or operators) or a folder of
  them;
- ``--trust-remote-code`` (the model's own Python may import anything) or ``--trust-pickle``;
- a ``config.json`` / ``model_index.json`` under the directory (4 levels deep) holds a ``quantization_config``
  key, or the scan cannot tell: more than ``MAX_ENTRIES`` entries, more than ``MAX_CONFIGS`` configs, one that
  is no plain file, too large, unreadable or no JSON, a folder it cannot list."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

CONFIG_NAMES = ("config.json", "model_index.json")  # a transformers model's, a pipeline's and its components'
MAX_CONFIG_BYTES = 4 << 20  # a config file past this is not read: torchao stays
MAX_CONFIGS = 32
MAX_DEPTH = 4  # a hub cache's models--org--name/snapshots/REV/component/config.json
MAX_ENTRIES = 512  # files and folders looked at in all
LIBRARIES = ("transformers", "diffusers", "torchao")
_owned = False


class _Unsure(Exception):
    """The scan cannot tell: torchao stays."""


def own_process() -> None:
    """This process is the CLI's (its entry point, before anything heavy imports): an export may hide torchao."""
    global _owned
    _owned = True


def hide_for(model: str | None, options: dict[str, Any]) -> bool:
    """Hide torchao for the rest of the process when ``model`` is a model directory that cannot need it
    (``options``: the export's keyword options); whether it did."""
    if not _owned or not model or options.get("trust_remote_code") or options.get("trust_pickle"):
        return False
    if any(name.split(".")[0] in LIBRARIES for name in sys.modules):
        return False
    from .hf.directory_files import is_model_directory

    path = Path(model)
    if not is_model_directory(path) or _claimed_by_plugin(path) or _quantized(path):
        return False
    sys.modules["torchao"] = None  # type: ignore[assignment]
    return True


def _claimed_by_plugin(path: Path) -> bool:
    """Whether a third-party loader's ``matches_directory`` takes ``path`` (or fails on it)."""
    from .hooks import manager
    from .hooks.contracts import Loader, optional

    for loader in manager.registry().loaders().values():
        if type(loader).__module__.split(".")[0] == __name__.split(".")[0]:
            continue
        matches = optional(loader, Loader, "matches_directory")
        try:
            if matches is not None and matches(path):
                return True
        except Exception:  # noqa: BLE001 - a loader that cannot tell: its directory, perhaps
            return True
    return False


def _quantized(root: Path) -> bool:
    """Whether a config under ``root`` holds a ``quantization_config`` key, or the scan cannot tell."""
    try:
        configs = _configs(root)
        return any(_names_quantization(path) for path in configs)
    except _Unsure:
        return True


def _configs(root: Path) -> list[Path]:
    """The config files under ``root`` (links to folders not followed), within the bounds."""
    found, pending, entries = [], [(root, 0)], 0
    while pending:
        folder, depth = pending.pop()
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    entries += 1
                    if entries > MAX_ENTRIES:
                        raise _Unsure
                    if entry.is_dir(follow_symlinks=False):
                        if depth + 1 < MAX_DEPTH:
                            pending.append((Path(entry.path), depth + 1))
                    elif entry.name in CONFIG_NAMES:
                        found.append(Path(entry.path))
        except OSError as e:
            raise _Unsure from e
    if len(found) > MAX_CONFIGS:
        raise _Unsure
    return found


def _names_quantization(path: Path) -> bool:
    """Whether the JSON at ``path`` has a ``quantization_config`` key at any depth. The file is opened without
    blocking and read only when it is a plain file of a bounded size (a FIFO or a device: unsure)."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            found = os.fstat(f.fileno())
            if not stat.S_ISREG(found.st_mode) or found.st_size > MAX_CONFIG_BYTES:
                raise _Unsure
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise _Unsure from e
    try:
        return _has_key(json.loads(data), "quantization_config")
    except (ValueError, RecursionError) as e:
        raise _Unsure from e


def _has_key(value: Any, key: str) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if key in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
