"""Give back an nn.Module from a version: the stored torch.export program (checked to load weights-only),
or a callable architecture the consumer chose plus verified safetensors weights.

A manifest is data written by whoever can write to the store, so the callable it records is imported
only when the consumer passes ``model_class=`` or allows its module (``allow_modules=`` /
CANN_MODEL_ZOO_ALLOW_MODULES); never from the manifest alone. Every file a load reads is a private copy
verified while it was copied (resolve.private_copy), so the bytes loaded are the bytes hashed."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError

ENV_ALLOW = "CANN_MODEL_ZOO_ALLOW_MODULES"


def allowed_modules(extra: list[str] | tuple[str, ...] | None) -> list[str]:
    """The modules whose callables a manifest may name: ``extra`` plus CANN_MODEL_ZOO_ALLOW_MODULES
    (comma-separated); a module allows its submodules."""
    env = [m.strip() for m in os.environ.get(ENV_ALLOW, "").split(",") if m.strip()]
    return [*[str(m).strip() for m in (extra or []) if str(m).strip()], *env]


def check_allowed(spec: str, allow: list[str] | tuple[str, ...] | None, name: str, version: str) -> None:
    module = spec.partition(":")[0]
    if any(module == a or module.startswith(a + ".") for a in allowed_modules(allow)):
        return
    raise ZooError(f"{name} version {version} names its architecture as the callable {spec[:120]!r}; a zoo "
                   "manifest never decides which code runs (anyone who can write to the store could name any "
                   "function). If you trust that code, pass model_class= to load_model, or allow its module: "
                   f"allow_modules=[{module[:80]!r}] or "
                   f"{ENV_ALLOW}={module[:80]}. Better: publish the exported artifact or example_inputs=, "
                   "which store a torch.export program")


def _load_program(path: Path, name: str, version: str) -> Any:
    from ..errors import LoadError, gist
    from ..load.archive_safety import load_exported_program

    try:  # verified bytes; still checked and weights-only
        program = load_exported_program(path, trust_pickle=False)
    except LoadError as e:
        raise ZooError(f"{name} version {version}: {gist(e)}", path=str(path)) from e
    try:
        module = program.module()
    except Exception as e:
        raise ZooError(f"{name} version {version}: the stored program does not give a module "
                       f"({type(e).__name__}: {gist(e, 200)}); the archive may need a newer torch",
                       path=str(path)) from e
    from ..bundle.torch_program import accept_keywords, follow_device, trainable

    # called by name as well as by position; .to(device) moves it; train()/eval() switch BatchNorm and dropout
    return trainable(follow_device(accept_keywords(module)))


def load_program(store: Any, name: str, version: str, manifest: dict[str, Any]) -> Any:
    """The verified torch.export program of a version, as a runnable module (``ExportedProgram.module()``):
    a private copy hashed while it is copied, then the CLI's checked weights-only loader on that copy."""
    from .resolve import private_copy

    rel = manifest["architecture"]["file"]
    with private_copy(store, name, version, manifest, [rel]) as root:
        return _load_program(root / rel, name, version)


def _build(root: Path, name: str, version: str, manifest: dict[str, Any], model_class: str | None,
           model_kwargs: dict[str, Any] | None) -> Any:
    import torch

    arch = manifest.get("architecture")
    if model_class:
        arch = {"kind": "callable", "callable": model_class, "kwargs": dict(model_kwargs or {})}
    if not arch:
        raise ZooError(f"{name} version {version} holds weights but no architecture; pass model_class="
                       "'pkg.module:Callable' (and model_kwargs=) to load_model, or framework='onnx'")
    if arch["kind"] == "torch.export":
        return _load_program(root / arch["file"], name, version)
    from ..load.file_loaders import import_callable

    try:
        factory = import_callable(arch["callable"])
    except Exception as e:
        raise ZooError(f"{name} version {version} was published with architecture {arch['callable']}, which does "
                       f"not import here ({getattr(e, 'message', e)}); install the package that defines it "
                       "or pass model_class=") from e
    try:
        module = factory(**arch.get("kwargs", {}))
    except Exception as e:
        raise ZooError(f"{arch['callable']}(**{arch.get('kwargs')}) raised {type(e).__name__}: {e}") from e
    if not isinstance(module, torch.nn.Module):
        raise ZooError(f"{arch['callable']} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _meta_load(root: Path, manifest: dict[str, Any], arch: dict[str, Any], path: Path) -> Any | None:
    """Build the module on the meta device (no random init) and assign the stored tensors; tied parameters
    are tied again. None when the module cannot be built that way (then the plain path is taken)."""
    import torch
    from safetensors.torch import load_file

    from ..load.file_loaders import import_callable

    try:
        factory = import_callable(arch["callable"])
        with torch.device("meta"):
            module = factory(**arch.get("kwargs", {}))
    except Exception:  # noqa: BLE001 - any failure: the plain path reports it properly
        return None
    if not isinstance(module, torch.nn.Module):
        return None
    groups: dict[int, list[str]] = {}
    for key, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(key)
    for key, b in module.named_buffers(remove_duplicate=False):
        groups.setdefault(id(b), []).append(key)
    state = load_file(str(path))
    expected = set(module.state_dict(keep_vars=True))
    for names in groups.values():
        present = [n for n in names if n in state]
        if present:
            for n in names:
                state.setdefault(n, state[present[0]])
    if set(state) != expected:
        return None
    module.load_state_dict(state, strict=True, assign=True)
    for names in groups.values():  # assign=True gives each name its own Parameter: restore the sharing
        if len(names) > 1:
            first = module.get_parameter(names[0]) if names[0] in dict(module.named_parameters()) else None
            if first is None:
                return None
            for n in names[1:]:
                owner, _, attr = n.rpartition(".")
                setattr(module.get_submodule(owner) if owner else module, attr, first)
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        return None  # e.g. non-persistent buffers computed in __init__
    return module


def rebuild(store: Any, name: str, version: str, manifest: dict[str, Any], model_class: str | None,
            model_kwargs: dict[str, Any] | None, allow_modules: list[str] | tuple[str, ...] | None = None) -> Any:
    """The module of a version. Every file it reads (weights, program) is first copied to a private
    directory, hashed while streaming and compared with the manifest; the loaders only open those copies."""
    from .resolve import private_copy

    recorded = manifest.get("architecture") or {}
    if not model_class and recorded.get("kind") == "torch.export":
        return load_program(store, name, version, manifest)
    if recorded.get("kind") == "diffusers-pipeline":
        return load_pipeline_entry(store, name, version, manifest)
    if not model_class and recorded.get("kind") == "callable":
        check_allowed(recorded["callable"], allow_modules, name, version)
    weights = manifest.get("weights")
    if not weights:
        targets = ", ".join(sorted(manifest.get("artifacts") or {}))
        raise ZooError(f"{name} version {version} holds no PyTorch weights (only exported artifacts: {targets}); "
                       "use framework='onnx'")
    needed = ["README.md"] + ([recorded["file"]] if recorded.get("file") and not model_class else [])
    arch = ({"kind": "callable", "callable": model_class, "kwargs": dict(model_kwargs or {})} if model_class
            else recorded)
    with private_copy(store, name, version, manifest, [weights["file"], *needed]) as root:
        module = _fill(root, name, version, manifest, arch, (model_class, model_kwargs))
    return module.eval()


def _fill(root: Path, name: str, version: str, manifest: dict[str, Any], arch: dict[str, Any],
          build_args: tuple[str | None, dict[str, Any] | None]) -> Any:
    """The module with its weights (from the verified copies under ``root``)."""
    from safetensors.torch import load_model as st_load_model

    wpath = root / manifest["weights"]["file"]
    if arch.get("kind") == "callable":
        module = _meta_load(root, manifest, arch, wpath)  # weights straight into a meta-built module
        if module is not None:
            return module
    module = _build(root, name, version, manifest, *build_args)
    try:
        missing, unexpected = st_load_model(module, str(wpath), strict=False)
    except Exception as e:
        raise ZooError(f"{name} version {version}: the weights do not fit the architecture "
                       f"({' '.join(str(e).split())[:300]})") from e
    if missing or unexpected:
        raise ZooError(f"{name} version {version}: the weights do not fit the architecture "
                       f"(missing {sorted(missing)[:6]}, unexpected {sorted(unexpected)[:6]})")
    return module


def load_pipeline_entry(store: Any, name: str, version: str, manifest: dict[str, Any]) -> Any:
    """The diffusers pipeline of a pipeline bundle's entry: its ``pipeline/`` folder (model_index.json, configs,
    tokenizers, safetensors) copied privately and verified, then read as an untrusted pipeline directory is
    (diffusion/directory.py: every class allow-listed, safetensors only, offline)."""
    from ..errors import ExportError, gist
    from .resolve import private_copy

    folder = str(manifest["architecture"]["file"]).rpartition("/")[0]
    with private_copy(store, name, version, manifest, [folder]) as root:
        from ..diffusion.directory import load_pipeline

        try:
            pipe, _ = load_pipeline(root / folder)
        except ExportError as e:
            raise ZooError(f"{name} version {version}: its pipeline does not load ({gist(e, 300)})") from e
    return pipe
