"""``torch/program.pt2`` in an atc_ready bundle: the torch.export program of the eval model, so the model zoo
can give a runnable module back (``load_model(name, framework="pytorch")``) from data alone, loaded
weights-only, with no callable to import. Best effort: a model torch.export cannot capture, a TorchScript
model or one with more than 1 GiB of weights gets no program and a warning in the manifest. A float model's
program is captured before the strip passes, so its dropout and BatchNorm switch with ``train()`` once
loaded (``trainable``); a quantized model's is its stripped arithmetic form."""
from __future__ import annotations

from pathlib import Path
from typing import Any

PROGRAM_FILE = "torch/program.pt2"
MAX_BYTES = 1 << 30  # above this the bundle would carry a second GiB-sized copy of the weights


def _skip(ctx: Any, why: str) -> list[Path]:
    ctx.reports.warnings.torch_program = f"no {PROGRAM_FILE} in the bundle: {why}"
    return []


def _positional(model: Any, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Inputs that are the leading positional parameters of ``forward`` are passed by position, so the
    loaded program is called as the model was (``module(x)``); anything else stays a keyword."""
    import inspect

    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return (), kwargs
    lead = params[:len(kwargs)]
    if set(lead) != set(kwargs):
        return (), kwargs
    return tuple(kwargs[n] for n in lead), {}


def _export(model: Any, args: tuple, kwargs: dict[str, Any], by_name: bool, dynamic: dict | None = None) -> Any:
    """torch.export with the export's dynamic axes (``dynamic``: capture/dynamic_dims.dynamic_shapes), else the
    batch dimension free (Dim.AUTO: torch keeps it static where the model needs it), so the loaded program
    takes any batch size; static shapes when that capture fails."""
    import inspect

    import torch

    if dynamic is not None:
        try:
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic, strict=False)
        except Exception:  # noqa: BLE001 - the static program below still serves
            pass
    elif by_name:
        names = [p for p in inspect.signature(model.forward).parameters][:len(args)]
        feed = {**dict(zip(names, args, strict=False)), **kwargs}
        dynamic = {n: ({0: torch.export.Dim.AUTO} if isinstance(v, torch.Tensor) and v.dim() else None)
                   for n, v in feed.items()}
        try:
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic)
        except Exception:  # noqa: BLE001 - any capture failure: the static program below still serves
            pass
    return torch.export.export(model, args, kwargs=kwargs)


def unstripped_copy(ctx: Any) -> Any:
    """A copy of the model before the strip passes, for the program (its dropout and BatchNorm switch with
    ``train()`` once loaded): a float module of at most MAX_BYTES bound for a format that writes a program;
    None otherwise (a quantized model's program is its stripped arithmetic form)."""
    import copy

    import torch

    model, loaded = ctx.model, ctx.loaded
    if not getattr(ctx.format, "writes_program", False) or loaded is None or loaded.kind != "module" \
            or not isinstance(model, torch.nn.Module) or ctx.options.quantize or loaded.extras.get("positional"):
        return None
    from torch.ao.quantization import FakeQuantizeBase

    from ..qat.fake_quant import QuantLayer

    if any(isinstance(m, (QuantLayer, FakeQuantizeBase)) for m in model.modules()):
        return None
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > min(ctx.options.external_data_threshold, MAX_BYTES):
        return None
    try:
        return copy.deepcopy(model).eval()
    except Exception:  # noqa: BLE001 - a module that does not copy: the program is the stripped model's
        return None


def write_program(ctx: Any, staging: Path) -> list[Path]:
    """``torch/program.pt2`` written into ``staging`` (or the warning why not). The unstripped copy is let go here:
    held on, it was a second copy of the weights through the validate stage's peak."""
    trainable, ctx.trainable_model = ctx.trainable_model, None
    return _write_program(ctx, staging, trainable)


def _write_program(ctx: Any, staging: Path, trainable: Any) -> list[Path]:
    import torch

    model, loaded = ctx.model, ctx.loaded
    if loaded is None or loaded.kind not in ("module", "exported_program") or not isinstance(model, torch.nn.Module):
        return _skip(ctx, f"a {getattr(loaded, 'kind', 'unknown')} model has no torch.export form")
    if loaded.extras.get("positional"):  # a program's inputs are Python names; these graph inputs are not
        return _skip(ctx, "the module declares graph_input_names (such as past_key_values.0.key) that a "
                          "torch.export program cannot carry as its input names")
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > min(ctx.options.external_data_threshold, MAX_BYTES):
        return _skip(ctx, f"{size} bytes of weights is past {min(ctx.options.external_data_threshold, MAX_BYTES)} "
                          "(a second copy of large weights is not written)")
    from ..capture.dynamic_dims import widened

    inputs = widened(ctx.example_inputs, ctx.dynamic_axes)  # a last call at batch 1 keeps the batch dynamic
    if loaded.kind == "module":
        args, kwargs = _positional(model, dict(inputs))
    else:
        from ..load.calling import split_call

        args, kwargs = split_call(loaded.kind, inputs, ctx.input_names, loaded.extras.get("keyword_inputs", ()))
    target = staging / PROGRAM_FILE
    try:
        import contextlib
        import sys
        import warnings

        form = ctx.program_form(model) if ctx.program_form is not None else contextlib.nullcontext()
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr), torch.no_grad(), form:
            warnings.simplefilter("ignore")
            from ..capture.dynamic_dims import dynamic_shapes, named_forward

            shapes = dynamic_shapes(ctx)
            program = None
            if trainable is not None and ctx.program_form is None:  # dropout and BatchNorm kept
                with contextlib.suppress(Exception), named_forward(trainable, list(ctx.input_names)) \
                        if shapes else contextlib.nullcontext():
                    program = _export(trainable, args, kwargs, True, shapes)
            if program is None:
                with named_forward(model, list(ctx.input_names)) if shapes else contextlib.nullcontext():
                    program = _export(model, args, kwargs, loaded.kind == "module", shapes)
        # torch.export records guards as Python source (``L['ids'].size()[0] == L['mask'].size()[0]``) that
        # torch.export.load exec()s; the .pt2 checker refuses any (validate checks this file with it). Loading
        # derives the same input checks from the graph's symbols and range constraints, so none is lost.
        program._guards_code = []
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(target))
    except Exception as e:  # noqa: BLE001 - torch.export's many failure types: the bundle is still complete
        target.unlink(missing_ok=True)
        return _skip(ctx, f"torch.export failed ({type(e).__name__}: {' '.join(str(e).split())[:160]})")
    return _checked(ctx, target)


def _checked(ctx: Any, target: Path) -> list[Path]:
    """The written program as every reader of the bundle will check it (validate, the parent's check before
    commit, zoo publish, load_model): one they would refuse, such as a module named with a newline that torch
    would write into generated source, is left out with the reason instead of failing the export."""
    from .. import errors
    from ..load.archive_safety import check_export_archive

    try:
        check_export_archive(target, trust_pickle=False)
    except errors.ExportError as e:
        target.unlink()
        return _skip(ctx, f"the .pt2 checker refuses it ({' '.join(str(e).split())[:200]})")
    return [target]


def accept_keywords(module: Any) -> Any:
    """The program was captured with its inputs by position (``module(x)``); the model's users also call it
    by name (``model(input_ids=..., attention_mask=...)``, as transformers models are). A pre-hook, run
    before torch.export's own input check, puts keyword inputs named after the program's positional
    placeholders into their positions."""
    names = [n.name for n in module.graph.nodes if n.op == "placeholder"]

    def to_positional(_module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if not kwargs or not set(kwargs) <= set(names[len(args):]):
            return None
        rest = names[len(args):]
        if any(n not in kwargs for n in rest[:max(rest.index(k) for k in kwargs) + 1]):
            return None  # a gap before a named input: leave the call as it is, torch names the mismatch
        return (*args, *(kwargs[n] for n in rest if n in kwargs)), {}

    module.register_forward_pre_hook(to_positional, with_kwargs=True, prepend=True)
    return module


def follow_device(module: Any) -> Any:
    """torch.export bakes the capture device (the CPU) into the program (``arange(device=cpu)``,
    ``to(x, cpu, bool)``, tensor metadata asserts): after ``module.to(device)`` (or ``.cpu()``, ``.npu()``:
    all go through ``_apply``) those nodes name the module's new device too, and its tensor constants move
    with it, so ``load_model(...).to("cann")`` runs there."""
    import torch

    apply = module._apply  # the bound nn.Module._apply

    def _apply(fn: Any, *args: Any, **kwargs: Any) -> Any:
        out = apply(fn, *args, **kwargs)
        constants = _apply_to_constants(module, fn)
        devices = {t.device for t in (*module.parameters(), *module.buffers(), *constants)}
        if len(devices) == 1:
            (device,) = devices
            changed = False
            for node in module.graph.nodes:
                old = node.kwargs.get("device")
                if isinstance(old, torch.device) and old != device:
                    node.update_kwarg("device", device)
                    changed = True
                if any(isinstance(a, torch.device) and a != device for a in node.args):  # aten.to.device
                    node.args = tuple(device if isinstance(a, torch.device) else a for a in node.args)
                    changed = True
            if changed:
                module.recompile()
        return out

    module._apply = _apply
    return module


_MODE_ARG = {"batch_norm": 5, "dropout": 2, "feature_dropout": 2, "alpha_dropout": 2, "feature_alpha_dropout": 2}


def trainable(module: Any) -> Any:
    """``train()``/``eval()`` on the loaded program (torch's unlifted module refuses both): each mode-dependent
    operator of the graph (``aten.batch_norm``'s ``training``, ``aten.dropout``'s ``train``) follows the mode,
    so in train mode BatchNorm normalises with batch statistics and updates its running ones, and dropout
    drops. A quantized model's program is its stripped form: there a BatchNorm folded into its conv and the
    dropout the export removed are not in the graph (fine-tuning trains the folded conv)."""
    import types

    import torch

    targets = {getattr(torch.ops.aten, name).default: index for name, index in _MODE_ARG.items()}

    def train(self: Any, mode: bool = True) -> Any:
        changed = False
        for node in self.graph.nodes:
            index = targets.get(node.target) if node.op == "call_function" else None
            if index is not None and index < len(node.args) and node.args[index] is not bool(mode):
                node.update_arg(index, bool(mode))
                changed = True
        if changed:
            self.recompile()
        return torch.nn.Module.train(self, mode)

    module.train = types.MethodType(train, module)
    module.eval = types.MethodType(lambda self: self.train(False), module)
    return module.eval()


def _apply_to_constants(module: Any, fn: Any) -> list[Any]:
    """The program's tensor constants (``get_attr`` targets that are neither parameters nor buffers, such as
    a lifted ``position_ids``) go where ``_apply`` sends the parameters: a device keeps its tensors together
    (a CPU constant indexed by npu indices raises, as on the device)."""
    import torch

    moved = []
    for node in module.graph.nodes:
        if node.op != "get_attr":
            continue
        owner, _, attr = node.target.rpartition(".")
        sub = module.get_submodule(owner) if owner else module
        t = sub.__dict__.get(attr)  # plain attributes only: parameters and buffers were moved by _apply
        if isinstance(t, torch.Tensor):
            with torch.no_grad():
                moved.append(fn(t))
            setattr(sub, attr, moved[-1])
    return moved
