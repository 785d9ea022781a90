"""What goes into a version: weights (safetensors), the architecture, exported artifacts keyed by target,
the model card, and the manifest's content part (files, lineage). Written into a staging directory."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import card as cards
from .artifacts import stage_artifact
from .zoo_errors import ZooError
from .file_copies import copy_hashed, fsync_file, hash_file
from .layout import PROGRAM, WEIGHTS

_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")


class Staged:
    """Accumulates files (with their sha256) and the manifest sections while a version is staged."""

    def __init__(self, root: Path):
        self.root = root
        self.known: dict[str, dict[str, Any]] = {}
        self.weights: dict[str, Any] | None = None
        self.architecture: dict[str, Any] | None = None
        self.artifacts: dict[str, dict[str, Any]] = {}
        self.lineage: list[dict[str, Any]] = []
        self.source: dict[str, Any] = {}
        self.tools: dict[str, str] = {}

    def copy(self, src: Path, rel: str) -> dict[str, Any]:
        self.known[rel] = copy_hashed(src, self.root / rel)
        return self.known[rel]

    def written(self, rel: str) -> dict[str, Any]:
        fsync_file(self.root / rel)
        self.known[rel] = hash_file(self.root / rel)
        return self.known[rel]


def stage(staged: Staged, model: Any, *, model_class: str | None, model_kwargs: dict[str, Any] | None,
          example_inputs: Any, trust_pickle: bool, artifacts: list[Any]) -> None:
    """Stage ``model`` (nn.Module, weights/checkpoint file, bundle/.onnx/.om) plus extra ``artifacts``."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ZooError("model file or bundle not found; pass an nn.Module, a weights/checkpoint file or an "
                           "exported bundle", path=path)
        staged.source = {"path": str(path)}
        if _is_artifact(path):
            stage_artifact(staged, path)
        else:
            _check_regular(path)
            _stage_weights_file(staged, path, model_class, model_kwargs, trust_pickle)
    elif model is not None:
        if not hasattr(model, "state_dict"):
            raise ZooError(f"cannot publish a {type(model).__name__}: pass an nn.Module, a weights/checkpoint "
                           "file path or an exported bundle directory")
        staged.source = {"object": f"{type(model).__module__}.{type(model).__qualname__}"}
        _stage_module(staged, model, model_class, model_kwargs, example_inputs)
    for extra in artifacts:
        path = Path(extra)
        if not path.exists() or not _is_artifact(path):
            raise ZooError("not an exported artifact; pass an atc_ready/om bundle directory, an om-stub or an "
                           ".onnx file", path=path)
        stage_artifact(staged, path)
    if staged.weights is None and not staged.artifacts:
        raise ZooError("nothing to publish: pass model= (an nn.Module, a weights file or a bundle)")
    if staged.weights is not None and staged.architecture is None:
        raise ZooError(f"refused: these are weights ({staged.weights['tensors']} tensors) with no architecture, so "
                       "load_model(framework='pytorch') could not give a module back. Pass model_class="
                       "'pkg.module:Callable' (--model-class, with model_kwargs= / --model-kwargs), or publish the "
                       "exported artifact (cann-export MODEL --format atc_ready) or a torch.export .pt2, which "
                       "carry the program", path=staged.source.get("path"))


def _check_regular(path: Path) -> None:
    """A model path that is not an artifact is a regular file, and a directory a bundle whose manifest.json is
    one: a FIFO would block the read, a directory is no weights file (checked by stat, nothing opened)."""
    from ..errors import ExportError
    from ..fs.regular import check_regular_file

    hint = "Pass an nn.Module, a weights/checkpoint file or an exported bundle directory"
    target, what = (path / "manifest.json", "bundle's manifest.json") if path.is_dir() else (path, "model file")
    if path.is_dir() and not (target.exists() or target.is_symlink()):
        raise ZooError(f"a directory but not an exported bundle (no manifest.json). {hint}", path=path)
    try:
        check_regular_file(target, what, hint)
    except ExportError as e:
        raise ZooError(e.message, path=target) from e


def _is_artifact(path: Path) -> bool:
    if path.is_dir():
        return (path / "manifest.json").is_file()
    if path.suffix == ".onnx":
        return True
    from ..bundle.read import open_artifact
    from ..errors import ExportError

    try:
        with open_artifact(path) as opened:
            return opened != path and (Path(opened) / "manifest.json").is_file()
    except (ExportError, OSError, ValueError):
        return False


# ------------------------------------------------------------------------------------------- weights


def _tools(staged: Staged) -> None:
    import safetensors
    import torch

    staged.tools.update({"torch": torch.__version__, "safetensors": safetensors.__version__})


def _stage_module(staged: Staged, model: Any, model_class: str | None, model_kwargs: dict[str, Any] | None,
                  example_inputs: Any) -> None:
    import torch
    from safetensors.torch import save_model

    if not isinstance(model, torch.nn.Module):
        raise ZooError(f"{type(model).__name__} is not a torch.nn.Module; pass a module or a file path")
    _tools(staged)
    target = staged.root / WEIGHTS
    target.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(target))  # drops the duplicates of tied tensors and records them in the header
    staged.written(WEIGHTS)
    staged.weights = _weights_info(target, converted_from=None)
    if model_class:
        staged.architecture = _callable_arch(model_class, model_kwargs, model.state_dict())
    elif example_inputs is not None:
        staged.architecture = _export_program(staged, model, example_inputs)
    else:
        staged.architecture = _inferred_arch(model)


def _weights_info(path: Path, converted_from: str | None) -> dict[str, Any]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np") as f:
            keys = list(f.keys())
            meta = f.metadata() or {}
    except Exception as e:
        raise ZooError(f"not a readable safetensors file ({type(e).__name__}: {e})", path=path) from e
    info: dict[str, Any] = {"file": WEIGHTS, "format": "safetensors", "tensors": len(keys)}
    tied = {k: v for k, v in meta.items() if v in keys and k not in keys}
    if tied:
        info["tied"] = tied
    if converted_from:
        info["converted_from"] = converted_from
    return info


def _stage_weights_file(staged: Staged, path: Path, model_class: str | None, model_kwargs: dict[str, Any] | None,
                        trust_pickle: bool) -> None:
    if path.suffix == ".safetensors":
        staged.copy(path, WEIGHTS)
        staged.weights = _weights_info(staged.root / WEIGHTS, converted_from=None)
        staged.source["sha256"] = staged.known[WEIGHTS]["sha256"]
        if model_class:  # shapes from the header only: the tensors are not read
            from types import SimpleNamespace

            from safetensors import safe_open

            _tools(staged)
            with safe_open(str(staged.root / WEIGHTS), "np") as f:
                state = {k: SimpleNamespace(shape=tuple(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
            staged.architecture = _callable_arch(model_class, model_kwargs, state, tied=staged.weights.get("tied"))
        return
    if path.suffix == ".pt2":
        return _stage_program_file(staged, path, trust_pickle)
    _stage_pickle(staged, path, model_class, model_kwargs, trust_pickle)


def _stage_program_file(staged: Staged, path: Path, trust_pickle: bool = False) -> None:
    """The .pt2 becomes the version's architecture and its stored tensors its weights: the archive is checked
    as export checks it and its weights read by torch's weights reader; the program is never loaded here."""
    from ..errors import LoadError, gist
    from ..load.program_weights import program_state_dict

    _tools(staged)
    try:
        state = program_state_dict(path, trust_pickle)
    except LoadError as e:
        raise ZooError(f"not a readable torch.export archive: {gist(e)}", path=path) from e
    staged.copy(path, PROGRAM)
    staged.source["sha256"] = staged.known[PROGRAM]["sha256"]
    staged.architecture = {"kind": "torch.export", "file": PROGRAM}
    _save_state(staged, state, converted_from="torch.export")


def _stage_pickle(staged: Staged, path: Path, model_class: str | None, model_kwargs: dict[str, Any] | None,
                  trust_pickle: bool) -> None:
    import pickle

    import torch

    from ..load.file_loaders import split_checkpoint

    _tools(staged)
    staged.source["sha256"] = hash_file(path)["sha256"]
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as refused:
        if not trust_pickle:
            found = [g for g in _unsafe_globals(path) if not g.startswith(("torch.", "collections.", "builtins."))]
            raise ZooError("refused: this file is a pickle of Python objects beyond tensors"
                           f"{' (' + ', '.join(found[:5]) + ')' if found else ''}; unpickling runs code. If you "
                           "trust it, publish with trust_pickle=True (--trust-pickle): it is converted to "
                           "safetensors and never unpickled again; better, publish model.state_dict() with "
                           "--model-class", path=path) from refused
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=False)
        except Exception as e:
            raise ZooError(f"not a readable PyTorch file ({type(e).__name__}: {e})", path=path) from e
    except Exception as e:
        raise ZooError(f"not a readable PyTorch file ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                       "pass a state_dict/checkpoint .pth, .safetensors, a .pt2 or a bundle", path=path) from e
    if isinstance(obj, torch.nn.Module):
        if model_class:
            staged.architecture = _callable_arch(model_class, model_kwargs, obj.state_dict())
        else:
            staged.architecture = _inferred_arch(obj)
        _save_state(staged, obj, converted_from="pickle")
        return
    try:
        state, extras = split_checkpoint(obj, path)
    except Exception as e:
        raise ZooError(getattr(e, "message", str(e)), path=path) from e
    if model_class:
        staged.architecture = _callable_arch(model_class, model_kwargs, state)
    _save_state(staged, state, converted_from="torch.save state_dict" + (" (checkpoint)" if extras else ""))


def _unsafe_globals(path: Path) -> list[str]:
    """The globals a refused pickle would import, as torch lists them (nothing is executed)."""
    import torch

    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:  # noqa: BLE001 - legacy or damaged files: the refusal stands without the list
        return []


def _save_state(staged: Staged, obj: Any, converted_from: str) -> None:
    """Write a module or a state_dict as safetensors; shared tensors are stored once (save_model does the
    same for modules and records the dropped names in the header)."""
    import torch
    from safetensors.torch import save_file, save_model

    target = staged.root / WEIGHTS
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(obj, torch.nn.Module):
        save_model(obj, str(target))
    else:
        state, meta, seen = {}, {}, {}
        for key in sorted(obj):
            t = obj[key]
            ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if ident in seen and t.numel():
                meta[key] = seen[ident]
                continue
            seen[ident] = key
            state[key] = t.detach().cpu().contiguous()
        save_file(state, str(target), metadata=meta or None)
    staged.written(WEIGHTS)
    staged.weights = _weights_info(target, converted_from=converted_from)


# -------------------------------------------------------------------------------------- architecture


def _import(spec: str) -> Any:
    from ..load.file_loaders import import_callable

    try:
        return import_callable(spec)
    except Exception as e:
        raise ZooError(getattr(e, "message", str(e)).replace("--model-class", "model_class")) from e


def _meta_state(factory: Any, kwargs: dict[str, Any], spec: str) -> dict[str, Any]:
    import torch

    try:
        with torch.device("meta"):
            module = factory(**kwargs)
    except Exception as e:
        raise ZooError(f"{spec}(**{json.dumps(kwargs)}) raised {type(e).__name__}: {e}; check model_kwargs") from e
    if not isinstance(module, torch.nn.Module):
        raise ZooError(f"{spec} returned {type(module).__name__}, not a torch.nn.Module")
    return module.state_dict()


def _check_shapes(spec: str, expected: dict[str, Any], state: dict[str, Any], tied: dict[str, str] | None) -> None:
    have = set(state) | set(tied or {})
    missing, unexpected = sorted(set(expected) - have), sorted(have - set(expected))
    wrong = [k for k in expected if k in state and tuple(expected[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or wrong:
        def show(keys: list[str]) -> str:
            return ", ".join(keys[:6]) + (f" (+{len(keys) - 6} more)" if len(keys) > 6 else "") if keys else "none"
        raise ZooError(f"the weights do not fit {spec}: missing {show(missing)}; unexpected {show(unexpected)}; "
                       f"other shape {show(wrong)}. Check model_class and model_kwargs")


def _callable_arch(spec: str, kwargs: dict[str, Any] | None, state: dict[str, Any],
                   tied: dict[str, str] | None = None) -> dict[str, Any]:
    kwargs = dict(kwargs or {})
    try:
        json.dumps(kwargs)
    except TypeError as e:
        raise ZooError(f"model_kwargs must be JSON-serialisable to be recorded ({e})") from e
    _check_shapes(spec, _meta_state(_import(spec), kwargs, spec), state, tied)
    return {"kind": "callable", "callable": spec, "kwargs": kwargs}


def _inferred_arch(model: Any) -> dict[str, Any]:
    cls = type(model)
    spec = f"{cls.__module__}:{cls.__qualname__}"
    why = None
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        why = f"{cls.__qualname__} is defined in a script or a function, so it cannot be imported later"
    else:
        try:
            _check_shapes(spec, _meta_state(_import(spec), {}, spec), model.state_dict(), None)
        except ZooError as e:
            why = f"{spec}() without arguments does not rebuild it ({e.message})"
    if why:
        raise ZooError(f"cannot record how to rebuild this module: {why}. Pass model_class='pkg.module:Callable' "
                       "with model_kwargs={...} (--model-class/--model-kwargs), or example_inputs=... to store a "
                       "torch.export archive")
    return {"kind": "callable", "callable": spec, "kwargs": {}, "inferred": True}


def _export_program(staged: Staged, model: Any, example_inputs: Any) -> dict[str, Any]:
    import torch

    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    try:
        ep = torch.export.export(model.eval(), args)
    except Exception as e:
        raise ZooError(f"torch.export failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); pass "
                       "model_class= and model_kwargs= instead") from e
    (staged.root / PROGRAM).parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, str(staged.root / PROGRAM))
    staged.written(PROGRAM)
    return {"kind": "torch.export", "file": PROGRAM}


def write_card(staged: Staged, name: str, metadata: dict[str, Any], card: Any) -> dict[str, Any]:
    body, fields_in = None, None
    if isinstance(card, dict):
        fields_in, body = card, card.get("body")
    elif isinstance(card, (str, os.PathLike)) and Path(card).is_file():
        body = Path(card).read_text(encoding="utf-8")
    elif isinstance(card, str):
        body = card
    fields = cards.card_fields(metadata, fields_in)
    if body and body.startswith("---\n"):  # a card with its own front matter: keep its body only
        end = body.find("\n---", 4)
        body = body[end + 4:].lstrip("\n") if end > 0 else body
    summary = [f"weights: {staged.weights['file']} ({staged.weights['tensors']} tensors)"] if staged.weights else []
    if staged.architecture:
        arch = staged.architecture
        summary.append(f"architecture: {arch.get('callable') or arch.get('file')}")
    summary += [f"artifact: {k}" for k in staged.artifacts]
    (staged.root / "README.md").write_text(cards.render(name, fields, body, summary), encoding="utf-8")
    staged.written("README.md")
    return fields
