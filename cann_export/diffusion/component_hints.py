"""ATC hints given for a whole pipeline: a hint naming a module (``insert_teacache``, ``keep_dtype``) goes to the
component its first segment names (``transformer.transformer_blocks.0`` -> ``transformer``'s
``transformer_blocks.0``); one that names nothing the pipeline has (the article's ``unet.mid_block`` on SD3) is a
warning naming what the pipeline has instead; ``memory_layout`` is a warning that ATC has no such option. Nothing
is dropped silently: every warning is returned for the manifest and raised as a Python warning."""
from __future__ import annotations

from typing import Any

from .known_pipelines import PIPELINES, components_of

MODULE_HINTS = ("insert_teacache", "keep_dtype")
LAYOUT = ("ATC has no memory_layout option (no 'nhwc_optimized'): an ONNX graph's --input_format is NCHW, NCDHW "
          "or ND, and ATC picks the device layout itself; the hint was left out")


def _blocks(pipe: Any, denoiser: str) -> str:
    """What the denoiser has to cache: SD3's ``transformer.transformer_blocks.0..N-1``, a UNet's mid block."""
    module = getattr(pipe, denoiser)
    blocks = getattr(module, "transformer_blocks", None)
    if blocks is not None:
        return f"{denoiser}.transformer_blocks.0..{len(blocks) - 1}"
    return f"{denoiser}.mid_block"


def _graph_module(pipe: Any, component: str) -> Any:
    return pipe.vae if component.startswith("vae_") else getattr(pipe, component, None)


def pipeline_hints(pipe: Any, hints: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """(the hints as the multi-graph writer takes them: ``COMPONENT:key`` for a component's own, with module paths
    inside its graph, ``model.<path>``), the warnings)."""
    cls = type(pipe).__name__
    names = components_of(cls)
    _, denoiser = PIPELINES[cls]
    out: dict[str, Any] = {}
    warnings: list[str] = []
    for key, value in (hints or {}).items():
        if key == "memory_layout":
            warnings.append(f"atc_hints memory_layout={value!r}: {LAYOUT}")
            continue
        if key not in MODULE_HINTS or ":" in str(key):
            out[key] = value
            continue
        by_component: dict[str, list[str]] = {}
        for path in [value] if isinstance(value, str) else list(value):
            head, _, rest = str(path).partition(".")
            module = _graph_module(pipe, head) if head in names else None
            found = module is not None and (not rest or rest in dict(module.named_modules()))
            if not found:
                has = f"its denoiser is {denoiser} (cacheable: {_blocks(pipe, denoiser)})"
                warnings.append(f"atc_hints {key}: {path!r} names nothing in this {cls} (components: "
                                f"{', '.join(names)}; {has}); the entry was left out")
                continue
            by_component.setdefault(head, []).append(f"model.{rest}" if rest else "model")
        for comp, paths in by_component.items():
            out[f"{comp}:{key}"] = paths
    return out, warnings
