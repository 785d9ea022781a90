"""The modules strip's Conv+BatchNorm fold replaced, kept on disk while the float64 reference noise is deferred
(inputs/float_noise.py): the noise is the fp32 reference's distance from the model as prepare ran it, which the
folded module no longer is (its folded weights are rounded to fp32). The tensors go to one safetensors file in
the export's staging (the modules stay as structure, on the meta device), so deferring costs a write and no
memory; the float64 twin, when the verdict needs it, puts the originals back, bit for bit."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .spill import SpillDir

FILE = "unfolded.safetensors"


class UnfoldedModules:
    """``modules`` (path in the model -> the module before the fold), their tensors on disk under ``directory``."""

    def __init__(self, directory: SpillDir, modules: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        self.directory = directory  # kept alive (and its file) while this record is
        self._file = Path(directory.path) / FILE
        tensors = {f"{k}/{name}": t.detach().contiguous() for k, module in enumerate(modules.values())
                   for name, t in module.state_dict(keep_vars=True).items()}
        save_file(tensors, str(self._file))
        self._modules = {path: module.to("meta") for path, module in modules.items()}  # their storage goes

    def restored(self) -> dict[str, Any]:
        """The modules as they were before the fold, fresh CPU copies read back from the file (each call)."""
        import copy

        from safetensors.torch import load_file

        tensors = load_file(str(self._file))
        found = {}
        for k, (path, meta) in enumerate(self._modules.items()):
            module = copy.deepcopy(meta).to_empty(device="cpu")
            prefix = f"{k}/"
            module.load_state_dict({n.removeprefix(prefix): t for n, t in tensors.items() if n.startswith(prefix)},
                                   strict=True)
            found[path] = module
        return found


def kept(ctx: Any, modules: dict[str, Any]) -> UnfoldedModules | None:
    """``modules`` (the fold's originals) on disk beside the export's output while the noise is deferred."""
    if not modules or not ctx.reference_noise_deferred:
        return None
    return UnfoldedModules(SpillDir(Path(ctx.output_path)), modules)


def in_place_of(model: Any, unfolded: dict[str, Any]) -> tuple[dict[int, Any], set[int], dict[str, Any]]:
    """For a copy of ``model`` with ``unfolded``'s modules back: deepcopy's memo entries swapping the modules still
    at those paths (by id), the ids of those modules' parameters (not to copy), and the modules whose place strip's
    identity pass removed from a Sequential (``put_back`` after the copy)."""
    swapped, left, missing = {}, set(), {}
    for path, module in unfolded.items():
        parent, _, name = path.rpartition(".")
        found = model.get_submodule(parent)._modules.get(name)  # the parent is there: a missing one raises
        if found is None:
            missing[path] = module
            continue
        swapped[id(found)] = module
        left |= {id(p) for p in found.parameters()}
    return swapped, left, missing


def put_back(model: Any, missing: dict[str, Any]) -> None:
    """Each of ``missing`` at its path again, in its place among a Sequential's numbered children."""
    for path, module in missing.items():
        parent, _, name = path.rpartition(".")
        children = model.get_submodule(parent)._modules
        children[name] = module
        if all(k.isdigit() for k in children):
            ordered = sorted(children.items(), key=lambda kv: int(kv[0]))
            children.clear()
            children.update(ordered)
