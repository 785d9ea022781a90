"""The cache measured at export, in diffusers' loop on the exported graphs (onnxruntime, fp32): the cache off
(threshold 0, or an interval of 1) must give the uncached image to ``OFF_ATOL``; at the recorded setting the steps
it skipped and the image's PSNR against the uncached one are recorded (a cache trades quality for steps: the number
is the user's to judge, and the manifest's to show)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from .cache_spec import CacheSpec

STEPS = 8  # a few more steps than the end-to-end check's, so a policy has steps to skip
OFF_ATOL = 1e-4


def off(spec: CacheSpec) -> CacheSpec:
    """``spec`` with its cache off: every step in full."""
    policy = {**spec.policy, **({"threshold": 0.0} if spec.policy["kind"] == "relative_l1" else {"every": 1})}
    return dataclasses.replace(spec, policy=policy)


def with_measure(end_to_end: dict[str, Any], pipe: Any, root: Path, spec: CacheSpec) -> dict[str, Any]:
    """The end-to-end section with the cache's measure added (``cache``); it passes only if the measure does."""
    import time

    started = time.perf_counter()
    measured = {**measure(pipe, root, spec), "seconds": round(time.perf_counter() - started, 3)}
    return {**end_to_end, "passed": end_to_end["passed"] and measured["passed"], "cache": measured}


def measure(pipe: Any, root: Path, spec: CacheSpec) -> dict[str, Any]:
    """The ``cache`` entry of the end-to-end section for a pipeline bundle staged at ``root``."""
    from .cached_denoiser import skipped_steps
    from .end_to_end import generate, graph_path, hosted_like, psnr
    from .hosted import fp32_run, source_module
    from .known_pipelines import components_of

    names = [*components_of(type(pipe).__name__), *(g for g in spec.graphs.values() if g != spec.component)]
    runs = {n: fp32_run(graph_path(root, n), source_module(pipe, n), arena=True) for n in names}
    uncached = generate(hosted_like(pipe, runs), "np", steps=STEPS)
    cache_off = hosted_like(pipe, runs, off(spec))
    image_off = generate(cache_off, "np", steps=STEPS)
    at_setting = hosted_like(pipe, runs, spec)
    image = generate(at_setting, "np", steps=STEPS)
    off_max = float(np.max(np.abs(image_off - uncached)))
    skipped = skipped_steps(at_setting)
    finite = bool(np.isfinite(image).all())
    return {"passed": off_max <= OFF_ATOL and not skipped_steps(cache_off) and finite, "steps": STEPS,
            "off": {"policy": off(spec).policy, "max_abs": off_max, "atol": OFF_ATOL},
            "at_setting": {"policy": dict(spec.policy), "skipped": len(skipped), "skipped_steps": skipped,
                           "psnr_db": psnr(image, uncached) if finite else None,
                           "max_abs": float(np.max(np.abs(image - uncached))) if finite else None}}
