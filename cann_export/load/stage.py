"""The load stage: a path, module or program into a LoadedModel, without touching the caller's model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import errors
from ..backend.eval_mode import to_eval
from ..context import ExportContext, LoadedModel
from ..decisions import decide
from ..hooks import manager


def load(ctx: ExportContext) -> str | None:
    import torch

    src = ctx.source
    if isinstance(src, torch.export.ExportedProgram):
        names = list(src.graph_signature.user_inputs)
        ex = None
        if src.example_inputs is not None:
            ex = dict(zip(names, src.example_inputs[0], strict=False))
            ex.update(src.example_inputs[1] or {})
        from .program_extras import program_extras

        ctx.loaded = LoadedModel(src.module(), "exported_program", ex,
                                 extras={"input_names": names, **program_extras(src)})
    elif isinstance(src, torch.jit.ScriptModule):
        ctx.loaded = LoadedModel(src, "torchscript")
    elif isinstance(src, torch.nn.Module):
        copy = _private_copy(src, share_weights=not ctx.options.quantize)
        declared = declared_inputs(src)
        ctx.loaded = (LoadedModel(copy, "module", extras=declared) if declared else None) \
            or _adopted(copy, ctx) or LoadedModel(copy, "module")
    elif isinstance(src, (str, Path)):
        ctx.loaded = _load_file(Path(src), ctx)
    else:
        raise errors.LoadError(f"cannot export a {type(src).__name__}; pass an nn.Module, an ExportedProgram "
                               "or the path of a model file")
    if ctx.options.task is not None and "task" not in ctx.loaded.extras:
        raise errors.OptionsError(f"--task {ctx.options.task} applies to a model directory (a transformers "
                                  "save_pretrained directory) or an in-memory transformers model; this model has "
                                  "no tasks. Drop --task", path=str(src) if isinstance(src, (str, Path)) else None)
    ctx.model = to_eval(ctx.loaded.model, ctx.loaded.kind)  # the later stages start from inference mode
    ctx.decisions = decide(ctx)  # what the later stages do, decided once here
    return ctx.loaded.kind


def _load_file(path: Path, ctx: ExportContext) -> LoadedModel:
    """``load_path``, after a torchvision that does not import beside this torch was hidden from the model's
    imports (transformers among them); a model that needs it is refused naming the pair to install."""
    from . import torchvision_pair

    ctx.reports.warnings.environment = torchvision_pair.hide_broken_torchvision()
    try:
        return load_path(path, ctx.options, manager.registry().loaders())
    except Exception as e:
        refusal = torchvision_pair.refusal(e, path)
        if refusal is None:
            raise
        raise refusal from e


def declared_inputs(module: Any) -> dict[str, Any]:
    """A module whose graph inputs are not Python identifiers (Optimum's ``past_key_values.0.key``) declares
    them in order as ``graph_input_names`` and takes them positionally (and by name in eager calls); capture
    then passes them in that order (and ``graph_dynamic_shapes()``, when it has one, as torch.export's
    dynamic_shapes). Any other module: nothing declared."""
    names = getattr(module, "graph_input_names", None)
    if not isinstance(names, (list, tuple)) or not names:
        return {}
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise errors.LoadError("graph_input_names must be distinct non-empty strings, one per forward input")
    extras: dict[str, Any] = {"input_names": list(names), "positional": True}
    shapes = getattr(module, "graph_dynamic_shapes", None)
    if callable(shapes):  # torch.export Dims per input, in order: capture makes those axes symbolic
        extras["dynamic_shapes"] = shapes()
        extras.update(_declared_axes(module))
    sets = getattr(module, "graph_shape_sets", None)
    if callable(sets):  # seed -> parity's input sets at other sizes (bundle/graph_shapes.py)
        extras["shape_sets"] = sets
    return extras


def _declared_axes(module: Any) -> dict[str, Any]:
    """The same axes by name for the TorchScript exporter (``graph_dynamic_axes``: ``{input: {axis: name}}``, and
    ``graph_output_axes()``: the outputs'), and the exporters the module asks ``--exporter auto`` to try first
    (``graph_exporter_order``; the trace gate still checks a trace that warned, capture/exporter_choice.py)."""
    out: dict[str, Any] = {}
    order = getattr(module, "graph_exporter_order", None)
    if not (isinstance(order, (list, tuple)) and order and all(isinstance(n, str) for n in order)):
        return out  # a module that does not ask for a trace keeps the exporters' own axes
    out["exporter_order"] = list(order)
    axes, outputs = getattr(module, "graph_dynamic_axes", None), getattr(module, "graph_output_axes", None)
    try:
        if isinstance(axes, dict) and axes:
            out["graph_axes"] = _named_axes(axes)
            if callable(outputs):
                out["output_axes"] = _named_axes(outputs())
    except (TypeError, ValueError, AttributeError) as e:
        raise errors.LoadError(f"{type(module).__name__}'s graph_dynamic_axes / graph_output_axes must map each name "
                               f"to {{axis: dimension name}} ({e})") from e
    return out


def _named_axes(axes: Any) -> dict[str, dict[int, str]]:
    return {str(n): {int(a): str(label) for a, label in dict(d).items()} for n, d in dict(axes).items()}


def _adopted(module: Any, ctx: ExportContext) -> LoadedModel | None:
    """The first loader that adopts an in-memory module (``Loader.adopt``: e.g. a transformers model gets its
    task's names and inputs, as its directory would), else None."""
    from ..hooks.contracts import Loader, optional
    from ..inputs.tracking import recorded_inputs

    opts = ctx.options
    given = bool(ctx.explicit_inputs is not None or opts.example_inputs_file or opts.input_shapes
                 or recorded_inputs(ctx.source) is not None)
    for loader in sorted(manager.registry().loaders().values(), key=lambda x: -x.priority):
        adopt = optional(loader, Loader, "adopt")
        loaded = adopt(module, opts, given) if adopt else None
        if loaded is not None:
            return loaded
    return None


def _private_copy(module: Any, share_weights: bool = False) -> Any:
    """Eval mode and the strip passes must never change the caller's module: work on a copy, on the CPU
    wherever the module lives (npu, npu-sim, cuda). Without training (``share_weights``) the copy's CPU
    parameters and buffers are new tensors over the caller's storage: no pass writes weights in place, and a
    large model is not held twice."""
    from ..backend.device_choice import cpu_copy, shared_weights_memo

    try:
        return cpu_copy(module, shared_weights_memo(module) if share_weights else None)
    except Exception as e:
        raise errors.LoadError(f"cannot copy the module to export it without modifying it ({type(e).__name__}: "
                               f"{_gist(e, 200)}); save it with torch.export.save or its state_dict and export "
                               "the file instead") from e


def load_path(path: Path, options: Any, loaders: dict[str, Any]) -> LoadedModel:
    """Check the path, pick the first matching loader by priority, and hash the file."""
    from ..fs.digests import sha256_file

    if not path.exists():
        raise errors.LoadError("model file not found; check the path", path=path)
    if path.is_dir():
        return _load_directory(path, options, loaders)
    check_regular_file(path, "model file")
    for loader in sorted(loaders.values(), key=lambda x: -x.priority):
        if loader.matches(path):
            loaded = loader.load(path, options)
            loaded.source_path = str(path)
            loaded.source_sha256 = sha256_file(path)
            return loaded
    raise errors.LoadError("no loader understands this file", path=path)


def _load_directory(path: Path, options: Any, loaders: dict[str, Any]) -> LoadedModel:
    """A model directory, read by the first loader (by priority) whose ``matches_directory`` takes it; the
    loader sets ``source_sha256`` over the files it read."""
    from ..hooks.contracts import Loader, optional

    for loader in sorted(loaders.values(), key=lambda x: -x.priority):
        matches = optional(loader, Loader, "matches_directory")
        if matches is not None and matches(path):
            loaded = loader.load(path, options)
            loaded.source_path = str(path)
            return loaded
    raise errors.LoadError("is a directory but not a model directory any loader reads (a transformers directory "
                           "has config.json); pass a model file (.pt2, .pt, .pth, .safetensors) or a directory "
                           "written by save_pretrained", path=path)


def check_regular_file(path: Path, what: str) -> None:
    """Refuse ``path`` unless it is a regular file (a link to one is fine), before any byte is read
    (fs.regular: a device, a FIFO or a socket is never a model)."""
    from ..fs.regular import check_regular_file as check

    check(path, what, "Save the model to a file (.pt2, .pt, .pth, .safetensors) and pass that path")


def _gist(e: BaseException, limit: int = 400) -> str:
    return errors.gist(e, limit)
