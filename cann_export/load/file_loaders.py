"""Loaders for model files: torch.export archives, TorchScript, state_dicts / checkpoints, safetensors,
and (only when trusted) whole pickled modules."""
from __future__ import annotations

import importlib
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..context import LoadedModel
from ..errors import LoadError
from .allowlist import TORCH_SAVE, TORCHSCRIPT
from .archive_safety import check_export_archive, load_exported_program, unsafe_globals
from .archives import open_checked, zip_names
from .meta_build import assign_state, build_skeleton, meta_tensors
from .program_extras import program_extras
from .repack import Canonical, canonical_copy

_CHECKPOINT_KEYS = ("model", "state_dict", "model_state_dict", "module", "weights")


__all__ = ["check_export_archive", "import_callable", "pickle_globals", "split_checkpoint", "zip_names"]
_zip_names = zip_names  # the name model_zoo imports


def _has(names: list[str] | None, suffix: str) -> bool:
    return bool(names) and any(n.endswith(suffix) for n in names)


class ExportedProgramLoader:
    name = "torch.export"
    priority = 100

    def matches(self, path: Path) -> bool:
        return path.suffix == ".pt2" or _has(_zip_names(path), "/archive_format")

    def load(self, path: Path, options: Any) -> LoadedModel:
        if not _has(_zip_names(path), "/archive_format"):
            raise LoadError(
                "not a readable torch.export archive (truncated or corrupt zip); re-create it with "
                "torch.export.save(torch.export.export(model, args), path)", path=path)
        ep = load_exported_program(path, bool(options.trust_pickle))
        module = ep.module()
        names = list(ep.graph_signature.user_inputs)
        inputs = None
        if ep.example_inputs is not None:
            args, kwargs = ep.example_inputs
            inputs = dict(zip(names, args, strict=False))
            inputs.update(kwargs or {})
        return LoadedModel(module, "exported_program", example_inputs=inputs,
                           extras={"input_names": names, **program_extras(ep)})


class TorchScriptLoader:
    name = "torchscript"
    priority = 90

    def matches(self, path: Path) -> bool:
        names = _zip_names(path)
        return _has(names, "/constants.pkl") and any("/code/" in n for n in names or [])

    def load(self, path: Path, options: Any) -> LoadedModel:
        import torch

        # torch.jit's C++ unpickler imports no Python; torch reads a re-packed copy of the allowed members
        with ExitStack() as stack:
            if options.trust_pickle:
                open_checked(path).close()
                target = path
            else:
                target = stack.enter_context(canonical_copy(path, TORCHSCRIPT)).copy_to_staging(".pt")
            try:
                module = torch.jit.load(str(target), map_location="cpu")
            except Exception as e:
                first = str(e).splitlines()[0] if str(e) else ""
                raise LoadError(f"torch.jit.load failed ({type(e).__name__}: {first}); the TorchScript archive is "
                                "corrupt or from an incompatible torch", path=path) from e
        return LoadedModel(module, "torchscript")


class SafetensorsLoader:
    name = "safetensors"
    priority = 80

    def matches(self, path: Path) -> bool:
        return path.suffix == ".safetensors"

    def load(self, path: Path, options: Any) -> LoadedModel:
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except Exception as e:
            raise LoadError(f"cannot read safetensors weights ({type(e).__name__}: {e})", path=path) from e
        return LoadedModel(build_from_state_dict(state, options, path), "module")


class TorchSaveLoader:
    """``torch.save`` files: state_dicts and checkpoints with weights_only=True; modules only when trusted."""

    name = "torch.save"
    priority = 0

    def matches(self, path: Path) -> bool:
        return True

    def load(self, path: Path, options: Any) -> LoadedModel:
        import torch

        names = _zip_names(path)
        if names is not None and not _has(names, "/data.pkl"):
            raise LoadError(
                "this zip file is not a torch archive (no data.pkl, no torch.export or TorchScript layout); "
                "pass a .pt2 from torch.export.save, a TorchScript .pt, a state_dict .pth or .safetensors weights",
                path=path)
        trust = bool(options.trust_pickle)
        with ExitStack() as stack:
            canon = None
            if names is not None and not trust:  # torch reads a re-packed copy of the allowed members
                canon = stack.enter_context(canonical_copy(path, TORCH_SAVE))
            elif names is not None:
                open_checked(path).close()
            obj = self._unpickle(path, names, canon, trust)
        if isinstance(obj, torch.nn.Module):
            return LoadedModel(obj, "module", extras={"pickled_module": True})
        state, extras = split_checkpoint(obj, path)
        return LoadedModel(build_from_state_dict(state, options, path), "module", extras=extras)

    @staticmethod
    def _unpickle(path: Path, names: list[str] | None, canon: Canonical | None, trust: bool) -> Any:
        import pickle

        import torch

        try:
            return torch.load(canon.view() if canon else str(path), map_location="cpu", weights_only=not trust)
        except pickle.UnpicklingError as e:
            found = pickle_globals(path, names, canon)
            if found is None:  # not a pickle stream at all
                raise LoadError(f"not a readable PyTorch file ({' '.join(str(e).split())[-120:]}); pass a .pt2, "
                                "a TorchScript .pt, a state_dict/checkpoint .pth or .safetensors weights",
                                path=path) from e
            unsafe = found
            raise LoadError(
                "refused to unpickle: the file holds Python objects beyond tensors and plain containers"
                f"{' (it references ' + ', '.join(unsafe[:5]) + ')' if unsafe else ''}. torch.load runs with "
                "weights_only=True because unpickling can run arbitrary code. If this is a whole pickled nn.Module "
                "you trust, pass --trust-pickle; better, save model.state_dict() (with --model-class) or a "
                "torch.export .pt2 archive", path=path) from e
        except Exception as e:
            raise LoadError(
                f"not a readable PyTorch file ({type(e).__name__}: {' '.join(str(e).split())[:200]}); pass a .pt2, "
                "a TorchScript .pt, a state_dict/checkpoint .pth or .safetensors weights", path=path) from e


def pickle_globals(path: Path, zip_names: list[str] | None = None,
                   canonical: Canonical | None = None) -> list[str] | None:
    """The globals a torch.save file (or its re-packed ``canonical`` copy) references beyond what weights-only
    loading allows (listed statically by torch, nothing is imported or run); None when the file is not a
    pickle stream at all."""
    import pickletools

    path = Path(path)
    try:
        if zip_names is not None:
            with canonical.checked() if canonical else open_checked(path) as z:
                data = z.read(next(n for n in z.names if n.endswith("/data.pkl")))
            for _ in pickletools.genops(data):
                pass
            import torch

            source = canonical.view() if canonical else str(path)
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(source))
        with path.open("rb") as f:
            head = f.read(64 << 20)
        next(pickletools.genops(head))  # the first opcode decodes: a pickle stream
    except Exception:  # noqa: BLE001 - any decoding failure means "not a pickle"
        return None
    return unsafe_globals(head)


def split_checkpoint(obj: Any, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (state_dict, the rest of a training checkpoint)."""
    import torch

    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj), {}
    if isinstance(obj, dict):
        for key in _CHECKPOINT_KEYS:
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                rest = {k: v for k, v in obj.items() if k != key}
                return dict(inner), {"checkpoint_keys": sorted(map(str, rest)), "epoch": rest.get("epoch"),
                                     "optimizer_state": rest.get("optimizer")}
    raise LoadError(
        f"holds a {type(obj).__name__}, not a model: expected a state_dict (name -> tensor) or a checkpoint "
        f"with one of the keys {', '.join(_CHECKPOINT_KEYS)}", path=path)


def import_callable(spec: str) -> Any:
    """Import ``pkg.module:Callable`` (the current directory is importable, as with ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise LoadError(f"--model-class {spec!r} must look like pkg.module:Callable")
    added = False
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
        added = True
    try:
        module = importlib.import_module(module_name)
        target = module
        for part in attr.split("."):
            target = getattr(target, part)
        return target
    except (ImportError, AttributeError) as e:
        raise LoadError(f"--model-class {spec!r} does not import ({type(e).__name__}: {e}); check the module "
                        "is on PYTHONPATH and the name is spelled as pkg.module:Callable") from e
    finally:
        if added:
            sys.path.remove(str(Path.cwd()))


def _echo(text: str, limit: int = 200) -> str:
    """User-supplied text quoted in an error: at most ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def build_from_state_dict(state: dict[str, Any], options: Any, path: Path) -> Any:
    """Instantiate ``--model-class`` with ``--model-kwargs`` and load the weights strictly."""
    import torch

    if not options.model_class:
        raise LoadError(
            f"holds a state_dict ({len(state)} tensors) but no architecture; pass --model-class "
            "pkg.module:Callable [--model-kwargs JSON] (model_class= in Python) to rebuild the module", path=path)
    factory = import_callable(options.model_class)
    kwargs = options.model_kwargs or {}
    skeleton = build_skeleton(factory, kwargs)  # parameters on meta: the file's tensors are assigned, not copied
    try:
        model = skeleton if skeleton is not None else factory(**kwargs)
    except Exception as e:
        raise LoadError(f"{options.model_class}(**{_echo(json.dumps(kwargs))}) raised "
                        f"{type(e).__name__}: {_echo(str(e))}; check --model-kwargs") from e
    if not isinstance(model, torch.nn.Module):
        raise LoadError(f"{options.model_class} returned {type(model).__name__}, not a torch.nn.Module")
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module."):]: v for k, v in state.items()}
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        def show(keys: list[str]) -> str:
            return ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "") if keys else "none"
        raise LoadError(f"weights do not match {options.model_class}: missing keys: {show(missing)}; "
                        f"unexpected keys: {show(unexpected)}. Check --model-class and --model-kwargs", path=path)
    if skeleton is not None:
        try:
            assign_state(model, state)
            if not meta_tensors(model):
                return model
        except RuntimeError:
            pass  # the copying load below reports it, in its own words
        model = factory(**kwargs)  # a tensor the state_dict does not reach, or a module that refuses assign
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise LoadError(f"weights do not fit {options.model_class}: {' '.join(str(e).split())[:500]}", path=path) from e
    return model
