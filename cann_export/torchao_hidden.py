"""torchao, hidden from a CLI export of a model directory, which cannot use it.

transformers (``quantizers/auto.py``) and diffusers import torchao with their model classes whenever it is
installed: 0.4-0.6 s and 13 MiB of every export in an environment that has it (this project's test extra brings
it), though only a torchao-quantized checkpoint uses it. A directory cann-export loads runs the libraries' own
classes; a ``quantization_config`` in any of its config files leaves torchao as it is (a transformers directory's
is refused later, hf/config_json.py, with its own message), as does ``--trust-remote-code`` (the model's own
Python may import anything). Hidden means ``sys.modules["torchao"] = None``: ``importlib.util.find_spec`` answers
None, which the libraries' availability checks read (load/torchvision_pair.py hides a broken torchvision the same
way). A model file (a pickle or a .pt2 may hold torchao's modules or operators) and the Python API (the caller's
process, which may use torchao itself) are left alone: only a process the CLI owns (``own_process``) hides it."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

CONFIG_NAMES = ("config.json", "model_index.json")  # a transformers model's, a pipeline's and its components'
MAX_CONFIG_BYTES = 4 << 20  # a config file past this is not read: torchao stays
MAX_DEPTH = 4  # a hub cache's models--org--name/snapshots/REV/component/config.json
MAX_FILES = 256  # files looked at in all; past this torchao stays
_owned = False


def own_process() -> None:
    """This process is the CLI's (its entry point, before anything heavy imports): an export may hide torchao."""
    global _owned
    _owned = True


def hide_for(model: str | None, trust_remote_code: bool) -> bool:
    """Hide torchao for the rest of the process when ``model`` is a directory that cannot need it; whether it did."""
    if not _owned or trust_remote_code or not model or "torchao" in sys.modules or not Path(model).is_dir():
        return False
    if _quantized(Path(model)):
        return False
    sys.modules["torchao"] = None  # type: ignore[assignment]
    return True


def _quantized(root: Path) -> bool:
    """Whether a config file under ``root`` names a quantization config, or the walk could not tell (too many
    files, an unreadable or oversized config)."""
    seen = 0
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).relative_to(root).parts)
        if depth >= MAX_DEPTH:
            dirs[:] = []
        seen += len(files)
        if seen > MAX_FILES:
            return True
        for name in files:
            if name in CONFIG_NAMES and _names_quantization(Path(folder) / name):
                return True
    return False


def _names_quantization(path: Path) -> bool:
    """Whether ``path`` names a quantization config, or is no plain file of a bounded size (a FIFO would block the
    read: the loader refuses such a file later, with torchao left as it is)."""
    try:
        found = path.stat()
        if not stat.S_ISREG(found.st_mode) or found.st_size > MAX_CONFIG_BYTES:
            return True
        with path.open("rb") as f:
            return b"quantization_config" in f.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return True
