"""``torch/program.pt2`` in an atc_ready bundle: the torch.export program of the stripped eval model, so
the model zoo can give a runnable module back (``load_model(name, framework="pytorch")``) from data alone,
loaded weights-only, with no callable to import. Best effort: a model torch.export cannot capture, a
TorchScript model or one past the external-data size gets no program and a warning in the manifest."""
from __future__ import annotations

from pathlib import Path
from typing import Any

PROGRAM_FILE = "torch/program.pt2"


def _skip(ctx: Any, why: str) -> list[Path]:
    ctx.reports.setdefault("warnings", {})["torch_program"] = f"no {PROGRAM_FILE} in the bundle: {why}"
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


def write_program(ctx: Any, staging: Path) -> list[Path]:
    import torch

    model, loaded = ctx.model, ctx.loaded
    if loaded is None or loaded.kind not in ("module", "exported_program") or not isinstance(model, torch.nn.Module):
        return _skip(ctx, f"a {getattr(loaded, 'kind', 'unknown')} model has no torch.export form")
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > ctx.options.external_data_threshold:
        return _skip(ctx, f"{size} bytes of weights is past the external-data threshold")
    inputs = ctx.example_inputs
    if loaded.kind == "module":
        args, kwargs = _positional(model, dict(inputs))
    else:
        args, kwargs = tuple(inputs[n] for n in ctx.input_names), {}
    target = staging / PROGRAM_FILE
    try:
        import contextlib
        import sys
        import warnings

        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, args, kwargs=kwargs)
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(target))
    except Exception as e:  # noqa: BLE001 - torch.export's many failure types: the bundle is still complete
        target.unlink(missing_ok=True)
        return _skip(ctx, f"torch.export failed ({type(e).__name__}: {' '.join(str(e).split())[:160]})")
    return [target]
