"""A large model's reference outputs on disk: each input set's outputs in .npy files, mapped read-only when read,
so the logits of every parity shape are never resident together (parity judges them set by set)."""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class SpillDir:
    """A staging directory beside the output (inside the sandbox's root when confined), removed when the export's
    run ends (``discard``), else when the last set that refers to it goes, at exit, or by the stale-staging sweep
    after a crash."""

    def __init__(self, target: Path) -> None:
        from ..fs import atomic

        self.path = atomic.staging_dir(target)
        self.target = target
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def remove(self) -> None:
        """The directory and its files gone now (arrays mapped before stay readable; new reads fail)."""
        self._remove()

    def keep(self, arrays: list[Any]) -> SpilledOutputs:
        return SpilledOutputs(self, arrays)


class SpilledOutputs(Sequence):
    """One input set's outputs, as a read-only sequence of numpy arrays mapped from their files on each access."""

    def __init__(self, directory: SpillDir, arrays: list[Any]) -> None:
        import numpy as np

        self._directory = directory  # kept alive (and its files) while this set is
        self._paths: list[str] = []
        for a in arrays:
            fd, name = tempfile.mkstemp(suffix=".npy", dir=directory.path)
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.ascontiguousarray(a), allow_pickle=False)
            self._paths.append(name)

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        import numpy as np

        return np.load(self._paths[k], mmap_mode="r", allow_pickle=False)


_OPEN: weakref.WeakValueDictionary[int, SpillDir] = weakref.WeakValueDictionary()  # one per export context


def spill_for(ctx: Any, model: Any) -> SpillDir | None:
    """Where ``model``'s reference outputs go: the export's SpillDir when its weights are past
    ``external_data_threshold`` (the large-model path), else None (kept in memory)."""
    from ..decisions import module_bytes

    opts = ctx.options
    if opts.external_data == "never" or ctx.output_path is None:
        return None
    if module_bytes(model) <= opts.external_data_threshold:
        return None
    found = _OPEN.get(id(ctx))
    if found is None or found.target != Path(ctx.output_path):  # a freed context's id reused by another export
        found = _OPEN[id(ctx)] = SpillDir(Path(ctx.output_path))
    return found


def discard(ctx: Any) -> None:
    """What this export spilled beside its output, removed when its run ends: a component's output is inside a
    multi-graph bundle's staging, which would move into place with whatever is left in it."""
    found = _OPEN.get(id(ctx))
    if found is not None and ctx.output_path is not None and found.target == Path(ctx.output_path):
        _OPEN.pop(id(ctx), None)
        found.remove()
    unfolded = getattr(ctx, "unfolded_modules", None)
    if unfolded is not None:
        unfolded.directory.remove()
