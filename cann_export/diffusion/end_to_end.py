"""The check no graph-by-graph parity makes: the exported components run in diffusers' own denoising loop (its
tokenizers, scheduler and guidance on the host; a fixed seed; a few steps) against diffusers' eager pipeline.
fp32 (onnxruntime): the latents within Optimum's bar (atol 1e-4, rtol 1e-2). Device (each component under the
emulation its device parity used): the image's cosine distance (diffusers' fp16 tests' measure) below 5e-2, its
PSNR recorded, and the NaN / Inf each component gave. A failure fails the export as a parity failure does."""
from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .known_pipelines import PIPELINES, components_of

PROMPT = "a photo of a cat"
STEPS = 2
GUIDANCE = 5.0
SEED = 0
LATENT_ATOL, LATENT_RTOL = 1e-4, 1e-2
MAX_COSINE_DISTANCE = 5e-2


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    """diffusers' ``numpy_cosine_similarity_distance``: 1 - cos(a, b) over the flattened arrays."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(1.0 - a @ b / norm) if norm > 0 else (0.0 if not a.any() and not b.any() else 1.0)


def psnr(image: np.ndarray, reference: np.ndarray) -> float | None:
    """Peak signal-to-noise ratio in dB of images in [0, 1] (None when they are equal)."""
    mse = float(np.mean((image.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return None if mse == 0 else float(10 * np.log10(1.0 / mse))


def graph_path(root: Path, name: str) -> str:
    """The graph file of component ``name`` in the bundle ``root`` (its manifest's model.file)."""
    from ..bundle.read import load_manifest_file

    own = load_manifest_file(root / "components" / name / "manifest.json")
    return str(root / "components" / name / str(own["model"]["file"]))


def device_runs(root: Path, names: tuple[str, ...], fixed: bool = True, slot: Any = None,
                modules: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each component under the device emulation its own parity used (its mode, the SoC's overflow, keep_dtype);
    ``fixed=False``: without the nodes --fix-precision added to its keep set; ``slot`` (hosted.OneOpen): each
    emulation built when its component first runs, one at a time. Given ``modules`` (the export's check), a
    component whose own check skipped the emulation (a large graph: not_emulated) runs in fp32, fed
    ``modules[name]``'s weights (hosted.fp32_run); a runner asked for the device emulation gets it everywhere."""
    from ..bundle.read import load_manifest_file
    from .hosted import emulated_run, fp32_run

    runs = {}
    for name in names:
        own = load_manifest_file(root / "components" / name / "manifest.json")
        parity = own.get("parity") or {}
        precision = parity.get("precision") or {}
        mode, overflow = str(precision.get("mode") or "force_fp16"), str(precision.get("overflow") or "saturation")
        added = set() if fixed else set(parity.get("fixed_by_keep_dtype") or [])
        keep = [n for n in precision.get("keep_dtype") or [] if n not in added]
        path = graph_path(root, name)
        opener = partial(fp32_run, path, modules.get(name)) if modules is not None and precision.get(
            "emulated") is False else partial(emulated_run, path, mode, overflow, keep)
        runs[name] = slot.lazy(opener) if slot is not None else opener()
    return runs


def not_emulated(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The components whose own device check skipped the emulation, with its reason (run in fp32 in the loop)."""
    from ..bundle.read import load_manifest_file

    return skipped_in({n: load_manifest_file(root / "components" / n / "manifest.json") for n in names})


def skipped_in(owns: dict[str, Any]) -> dict[str, str]:
    """Of components' own manifests (name -> manifest), those saying the device emulation was skipped: its reason."""
    said = {}
    for name, own in owns.items():
        precision = ((own or {}).get("parity") or {}).get("precision") or {}
        if precision.get("emulated") is False:
            said[name] = str(precision.get("reason") or "skipped")
    return said


def fix_kept(root: Path, names: tuple[str, ...]) -> list[str]:
    """The components whose keep set --fix-precision grew (their parity records ``fixed_by_keep_dtype``)."""
    from ..bundle.read import load_manifest_file

    return [n for n in names if (load_manifest_file(root / "components" / n / "manifest.json").get("parity") or {})
            .get("fixed_by_keep_dtype")]


def device_verdict(pipe: Any, runs: dict[str, Any], eager_image: np.ndarray,
                   skipped: dict[str, str] | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """The image of ``pipe``'s loop over the emulated ``runs`` against diffusers' ``eager_image``: finite, no
    component's NaN / Inf, cosine distance under the bar (and its PSNR); with the image itself. ``skipped``: the
    components run in fp32 (not_emulated), recorded with their reasons."""
    from .hosted import nonfinite

    device = hosted_like(pipe, runs)
    image = generate(device, "np")
    counts = nonfinite(device)
    bad = {n: counts[n] for n in components_of(type(pipe).__name__) if n in counts}  # in the pipeline's order
    finite = bool(np.isfinite(image).all())
    distance = cosine_distance(image, eager_image) if finite else 1.0
    entry = {"passed": finite and not any(bad.values()) and distance < MAX_COSINE_DISTANCE,
             "cosine_distance": distance, "psnr_db": psnr(image, eager_image) if finite else None,
             "max_cosine_distance": MAX_COSINE_DISTANCE, "nonfinite": bad}
    if skipped:
        entry["not_emulated"] = dict(skipped)
    return entry, image


def generate(pipe: Any, output_type: str, steps: int = STEPS, prompt: str = PROMPT) -> np.ndarray:
    import torch

    out = pipe(prompt=prompt, generator=torch.Generator().manual_seed(SEED), num_inference_steps=steps,
               guidance_scale=GUIDANCE, output_type=output_type)
    images = out.images
    return images.numpy() if hasattr(images, "numpy") else np.asarray(images)


def generate_with_latents(pipe: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the loop's final latents, its image) from one run of ``pipe``: the latents are what the last step hands its
    callback, which ``output_type="latent"`` returns (a second loop run only for them doubled the check's cost)."""
    import torch

    seen: dict[str, Any] = {}

    def keep_latents(_pipe: Any, _step: int, _t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        seen["latents"] = tensors["latents"].detach().clone()
        return {}

    out = pipe(prompt=PROMPT, generator=torch.Generator().manual_seed(SEED), num_inference_steps=STEPS,
               guidance_scale=GUIDANCE, output_type="np", callback_on_step_end=keep_latents,
               callback_on_step_end_tensor_inputs=["latents"])
    return seen["latents"].numpy(), np.asarray(out.images)


def hosted_like(pipe: Any, runs: dict[str, Any], cache: Any = None) -> Any:
    """``pipe``'s class, scheduler and tokenizers with ``runs`` in place of its model parts (its denoiser applying
    ``cache``, a cache_spec.CacheSpec, when given)."""
    from .cached_denoiser import cached_denoiser
    from .hosted import hosted_pipeline, pipeline_flags

    cls = type(pipe).__name__
    encoders, denoiser = PIPELINES[cls]
    parts = {"scheduler": copy.deepcopy(pipe.scheduler)}
    parts.update({k: v for k, v in pipe.components.items() if k.startswith("tokenizer") and v is not None})
    configs = {n: getattr(pipe, n).config for n in (*encoders, denoiser, "vae")}
    cached = cached_denoiser(cache, denoiser, runs, configs[denoiser], parts["scheduler"]) if cache else None
    return hosted_pipeline(cls, parts, runs, configs, cached, flags=pipeline_flags(dict(pipe.config)))


def check(pipe: Any, root: Path, images: dict[str, Any] | None = None) -> dict[str, Any]:
    """The end-to-end section of a pipeline bundle staged at ``root`` (every component's graph written);
    ``images`` receives the three images compared (``eager``, ``fp32``, ``device``) for the report. Each loop
    holds one component's graph at a time (hosted.OneOpen): the pipeline's weights are held once by ``pipe``
    and at most once more by the graph running, not once per component and per check."""
    import time

    from .hosted import OneOpen, fp32_run, nonfinite, source_module

    started = time.perf_counter()
    names = components_of(type(pipe).__name__)
    modules = {n: source_module(pipe, n) for n in names}  # a large graph's session is fed their weights
    eager_latents, eager_image = generate_with_latents(pipe)
    slot = OneOpen()
    fp32 = hosted_like(pipe, {n: slot.lazy(partial(fp32_run, graph_path(root, n), modules[n])) for n in names})
    latents, image = generate_with_latents(fp32)
    slot.close()
    close = bool(np.allclose(latents, eager_latents, atol=LATENT_ATOL, rtol=LATENT_RTOL))
    fp32_entry = {"passed": close and image.shape == eager_image.shape,
                  "latents_max_abs": float(np.max(np.abs(latents - eager_latents))),
                  "image_max_abs": float(np.max(np.abs(image - eager_image))),
                  "tolerance": {"atol": LATENT_ATOL, "rtol": LATENT_RTOL}, "nonfinite": nonfinite(fp32)}
    skipped = not_emulated(root, names)
    device_entry, device_image = device_verdict(pipe, device_runs(root, names, slot=slot, modules=modules),
                                                eager_image, skipped)
    slot.close()
    if fixed := fix_kept(root, names):  # rerun with the fix: the loop as it was without the keep sets it added
        unfixed, _ = device_verdict(pipe, device_runs(root, names, fixed=False, slot=slot, modules=modules),
                                    eager_image, skipped)
        slot.close()
        device_entry["before_fix"] = {**unfixed, "fixed_components": fixed}
    if images is not None:
        images.update(eager=eager_image, fp32=image, device=device_image)
    return {"passed": fp32_entry["passed"] and device_entry["passed"], "prompt": PROMPT, "steps": STEPS,
            "guidance_scale": GUIDANCE, "seed": SEED, "image_shape": list(eager_image.shape),
            "fp32": fp32_entry, "device": device_entry, "seconds": round(time.perf_counter() - started, 3)}
