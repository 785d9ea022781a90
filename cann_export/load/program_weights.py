"""The tensors a .pt2 stores, read without loading its program: torch's own weights reader
(torch/export/pt2_archive/_package.py ``_load_state_dict``, which torch.export.load calls too) over the checked,
re-packed copy, with every unpickling forced weights-only. The program JSON is checked (archive_safety) but never
deserialized, compiled or run, so publishing a .pt2 runs none of its code in the caller's process."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import LoadError
from .allowlist import PT2
from .archive_safety import check_export_archive, quiet_torch, weights_only_unpickling
from .repack import canonical_copy

MODEL_NAME = "model"  # torch.export.save's name for the one program it writes (models/model.json)


def program_state_dict(path: Path | str, trust_pickle: bool) -> dict[str, Any]:
    """The parameters and persistent buffers of the program in ``path`` (FQN -> tensor), as its module's
    state_dict holds them. Trusted (``trust_pickle``): the bounds-checked file itself, names checked."""
    path = Path(path)
    if trust_pickle:
        check_export_archive(path, trust_pickle=True)
        return _read(path, lambda: str(path), trust_pickle)
    with canonical_copy(path, PT2) as canon:
        check_export_archive(path, False, canon)
        return _read(path, canon.view, trust_pickle)


def _read(path: Path, source: Any, trust_pickle: bool) -> dict[str, Any]:
    import torch
    from torch.export.pt2_archive._package import PT2ArchiveReader, _load_state_dict

    try:
        with quiet_torch():
            if trust_pickle:
                state = _load_state_dict(PT2ArchiveReader(source()), MODEL_NAME)
            else:
                with weights_only_unpickling():
                    state = _load_state_dict(PT2ArchiveReader(source()), MODEL_NAME)
    except Exception as e:
        raise LoadError(f"its weights could not be read ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
                        "the archive may be truncated, crafted, or written by an incompatible torch version",
                        path=path) from e
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise LoadError("its weights are not the tensors torch.export.save writes (a legacy or crafted weights "
                        "file); re-create it with torch.export.save", path=path)
    return {str(k): t.detach() for k, t in state.items()}
