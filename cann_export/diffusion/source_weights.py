"""The source pipeline's weights a bundle carries beside its graphs, so the zoo's ``load_model(name,
framework="pytorch")`` gives the diffusers pipeline back (as a one-graph atc_ready bundle carries its torch.export
program): each model part's safetensors as its own ``save_pretrained`` writes them, under ``pipeline/<part>/``.
Only formats that carry a torch program carry them (atc_ready; ``--format onnx`` leaves them out). No pickle:
``safe_serialization`` only, and the names are an allow-list."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .files import PIPELINE_DIR, WEIGHT_FILE
from .known_pipelines import PIPELINES


def carries_weights(export_format: str) -> bool:
    """Whether a pipeline bundle in ``export_format`` carries the source weights (its Format writes a torch
    program for a single graph)."""
    from ..hooks.manager import registry

    fmt = registry().formats().get(export_format)
    return bool(getattr(fmt, "writes_program", False))


def model_parts(pipeline_class: str) -> tuple[str, ...]:
    """The pipeline's parts that hold weights, by model_index.json's names."""
    encoders, denoiser = PIPELINES[pipeline_class]
    return (*encoders, denoiser, "vae")


def write_weights(pipe: Any, root: Path) -> list[str]:
    """Each model part's safetensors written under ``root/pipeline/<part>/``; their bundle paths."""
    from .planner import pipeline_class

    written = []
    for part in model_parts(pipeline_class(pipe)):
        target = root / PIPELINE_DIR / part
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".cann-tmp-weights-", dir=root) as tmp:
            getattr(pipe, part).save_pretrained(tmp, safe_serialization=True)
            for name in sorted(os.listdir(tmp)):
                if WEIGHT_FILE.fullmatch(name):
                    os.replace(Path(tmp) / name, target / name)
                    written.append(f"{PIPELINE_DIR}/{part}/{name}")
    return written
