"""The plan of a diffusers pipeline: one component per graph (``table.components_of``), each exported on the
tensors the pipeline's own code gives it (its ``encode_prompt`` for the denoiser's text conditioning), and the
connections (which output feeds which input; the host steps between them, such as the scheduler and the text
embeddings' concatenation, are named in the run notes)."""
from __future__ import annotations

import re
from typing import Any

from ..plan import Component, Plan
from ..errors import OptionsError
from .known_pipelines import KIND, PIPELINES, POOLED_INTO, components_of, tokenizer_of
from .sides import FIXED_SIDES, side_range

EXAMPLE_BATCH = 2  # torch.export must not specialize the batch to 1
EXAMPLE_PROMPTS = ["a photo of a cat", "a dog"]


def pipeline_class(pipe: Any) -> str:
    name = type(pipe).__name__
    if name not in PIPELINES:
        raise OptionsError(f"a {name} is not a pipeline this tool exports yet; it exports {', '.join(PIPELINES)}")
    return name


def run_notes(cls: str) -> dict[str, Any]:
    """The ``run`` section: the pipeline class whose loop runs the graphs, its denoiser, and the host's steps."""
    _, denoiser = PIPELINES[cls]
    return {"pipeline": cls, "loop": denoiser, "scheduler": "host (diffusers, pipeline/scheduler)",
            "guidance": f"classifier-free guidance runs {denoiser} on the prompt and negative batch together",
            "latents": "vae_decoder takes latents / scaling_factor + shift_factor (host)",
            **({"fixed_sides": {denoiser: FIXED_SIDES[denoiser]}} if denoiser in FIXED_SIDES else {})}


def hidden_state_names(names: list[str]) -> list[str]:
    """``hidden_states.N`` outputs in layer order."""
    found = [n for n in names if re.fullmatch(r"hidden_states\.[0-9]{1,4}", n)]
    return sorted(found, key=lambda n: int(n.split(".")[1]))


def wiring(cls: str, outputs: dict[str, list[str]], cache: Any = None) -> list[tuple[str, str, str, str]]:
    """The connections of a ``cls`` bundle from its text encoders' output names, and those of its ``cache``'s graphs
    (cache_spec.CacheSpec; validate re-derives them)."""
    encoders, denoiser = PIPELINES[cls]
    conns: list[tuple[str, str, str, str]] = []
    for enc in encoders:
        names = outputs.get(enc, [])
        hidden = hidden_state_names(names)
        if cls in POOLED_INTO and hidden:  # SD3, SDXL: CLIP's penultimate hidden state and pooled embedding
            conns.append((enc, hidden[-2], denoiser, "encoder_hidden_states"))
            if "text_embeds" in names:  # SDXL's first CLIP has no projection: only its hidden state is read
                conns.append((enc, "text_embeds", denoiser, POOLED_INTO[cls]))
        else:
            conns.append((enc, "last_hidden_state", denoiser, "encoder_hidden_states"))
    out = "out_hidden_states" if denoiser == "transformer" else "out_sample"
    conns.append((denoiser, out, "vae_decoder", "latent_sample"))
    conns.append(("vae_encoder", "latent_parameters", denoiser, "hidden_states" if denoiser == "transformer"
                  else "sample"))
    return conns + (cache_wiring(cache, conns) if cache is not None else [])


def cache_wiring(cache: Any, conns: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """The skip graph takes what the denoiser takes and its residuals; the probe what it needs of the denoiser's."""
    from .cache_graphs import Probe
    from .cache_spec import residual_names

    den = cache.component
    into = [c for c in conns if c[2] == den]
    out = [(a, o, cache.skip, i) for a, o, _, i in into]
    out += [(den, n, cache.skip, n) for n in residual_names(cache)]
    if cache.probe:
        out += [(a, o, cache.probe, i) for a, o, _, i in into if i in Probe.graph_input_names]
    return out


def pipeline_plan(pipe: Any, cache: Any = None) -> Plan:
    """The plan of ``pipe`` (a pipeline of known_pipelines.PIPELINES, on the CPU, fp32); ``cache``
    (cache_spec.CacheSpec): the denoiser's graphs for it (cache_graphs) in place of the plain one."""
    import torch

    from .graphs import GUIDANCE_EMBEDDING, TextEncoder, VaeDecoder, VaeEncoder, added_inputs, denoiser_graph

    cls = pipeline_class(pipe)
    encoders, denoiser_name = PIPELINES[cls]
    for part in (*encoders, denoiser_name, "vae", *(tokenizer_of(e) for e in encoders)):
        if getattr(pipe, part, None) is None:
            raise OptionsError(f"the {cls} has no {part}; every part of {', '.join(components_of(cls))} is exported")
    gen = torch.Generator().manual_seed(0)
    comps: list[Component] = []
    with torch.no_grad():
        for enc in encoders:
            tok = getattr(pipe, tokenizer_of(enc))
            length = min(int(tok.model_max_length), 77 if "clip" in type(tok).__name__.lower() else 256)
            ids = tok(EXAMPLE_PROMPTS, padding="max_length", max_length=length, truncation=True,
                      return_tensors="pt").input_ids
            module = getattr(pipe, enc).eval()
            hidden = cls in POOLED_INTO and "CLIP" in type(module).__name__  # SD3 / SDXL read CLIP's
            comps.append(Component(enc, enc, TextEncoder(module, hidden_states=hidden), {"input_ids": ids}))
        denoiser = getattr(pipe, denoiser_name).eval()
        side = int(denoiser.config.sample_size)
        channels = int(denoiser.config.in_channels)
        scale = pipe.vae_scale_factor
        latents = torch.randn(EXAMPLE_BATCH, channels, side, side, generator=gen)
        timestep = torch.tensor([500.0, 250.0])
        conditioning = _conditioning(pipe, cls, side * scale)
        if denoiser_name == "unet" and GUIDANCE_EMBEDDING in added_inputs(denoiser.config):  # an LCM UNet: the
            scales = torch.full((EXAMPLE_BATCH,), 4.0)  # guidance-scale embedding the pipeline makes on the host
            dim = int(denoiser.config.time_cond_proj_dim)
            conditioning[GUIDANCE_EMBEDDING] = pipe.get_guidance_scale_embedding(scales, embedding_dim=dim)
        sides = side_range(denoiser, side)
        first = "hidden_states" if denoiser_name == "transformer" else "sample"
        feed = {first: latents, **conditioning, "timestep": timestep}
        if cache is None:
            comps.append(Component(denoiser_name, denoiser_name, denoiser_graph(denoiser_name, denoiser, sides), feed))
        else:
            comps += _cache_components(cache, denoiser, sides, feed)
        vae = pipe.vae.eval()
        image = torch.rand(EXAMPLE_BATCH, 3, side * scale, side * scale, generator=gen) * 2 - 1
        comps.append(Component("vae_encoder", "vae_encoder", VaeEncoder(vae, sides, scale), {"sample": image}))
        comps.append(Component("vae_decoder", "vae_decoder", VaeDecoder(vae, sides),
                               {"latent_sample": latents}))
    comps = [Component(c.name, c.role, c.module, {n: c.example_inputs[n] for n in c.module.graph_input_names})
             for c in comps]
    outputs = {c.name: list(c.module(**c.example_inputs)) for c in comps[:len(encoders)]}
    return Plan(KIND, comps, [], run_notes(cls), host_connections=wiring(cls, outputs, cache))


def _cache_components(cache: Any, denoiser: Any, sides: tuple[int, int], feed: dict[str, Any]) -> list[Component]:
    """The full denoiser (with the residual outputs), the skip graph fed the residuals of the example, the probe."""
    from .cache_graphs import Probe, full_graph, skip_graph

    name = cache.component
    full = full_graph(name, denoiser, sides, cache)
    residuals = {n: v for n, v in full(**feed).items() if n.startswith("cache_residual")}
    comps = [Component(name, name, full, feed),
             Component(cache.skip, cache.skip, skip_graph(name, denoiser, sides, cache), {**feed, **residuals})]
    if cache.probe:
        comps.append(Component(cache.probe, cache.probe, Probe(denoiser, sides), feed))
    return comps


def _conditioning(pipe: Any, cls: str, pixels: int) -> dict[str, Any]:
    """The denoiser's text conditioning for the example prompts, from the pipeline's own ``encode_prompt`` (SDXL's
    ``time_ids`` as its ``_get_add_time_ids`` makes them: original size, crop corner, target size, at ``pixels``)."""
    import torch

    if cls == "StableDiffusion3Pipeline":
        embeds, _, pooled, _ = pipe.encode_prompt(prompt=EXAMPLE_PROMPTS, prompt_2=None, prompt_3=None,
                                                  do_classifier_free_guidance=False, device="cpu")
        return {"encoder_hidden_states": embeds, "pooled_projections": pooled}
    if cls == "StableDiffusionXLPipeline":
        embeds, _, pooled, _ = pipe.encode_prompt(prompt=EXAMPLE_PROMPTS, device="cpu", num_images_per_prompt=1,
                                                  do_classifier_free_guidance=False)
        time_ids = torch.tensor([[pixels, pixels, 0, 0, pixels, pixels]], dtype=embeds.dtype)
        return {"encoder_hidden_states": embeds, "text_embeds": pooled,
                "time_ids": time_ids.repeat(embeds.shape[0], 1)}
    embeds, _ = pipe.encode_prompt(EXAMPLE_PROMPTS, "cpu", 1, False)
    return {"encoder_hidden_states": embeds}
