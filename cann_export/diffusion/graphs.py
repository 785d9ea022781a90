"""The graphs of a diffusers pipeline, with Optimum's input and output names (optimum-onnx model_configs.py):
text encoders ``input_ids`` -> ``text_embeds`` / ``pooler_output``, ``last_hidden_state`` and
``hidden_states.N``; SD3's transformer ``hidden_states``, ``encoder_hidden_states``, ``pooled_projections``,
``timestep`` -> ``out_hidden_states``; a UNet ``sample``, ``timestep``, ``encoder_hidden_states`` -> ``out_sample``;
``vae_encoder`` ``sample`` -> ``latent_parameters``; ``vae_decoder`` ``latent_sample`` -> ``sample`` (scaling and
shift stay on the host). Each takes tensors by name and returns a dict, as the multi-graph wrappers do."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..hf.cache_wrappers import TRACE_FIRST, _Graph

MAX_BATCH = 64
MAX_SIDE = 1024  # latent pixels per side


class PipelineGraph(_Graph):
    """A pipeline component's graph: batch, height and width dynamic where the architecture takes them. Captured
    TorchScript-first, as Optimum does (a trace that warned is kept only when the trace gate's check passes, else
    dynamo runs: capture/exporter_choice.py); every output's axis 0 is the batch (``graph_output_axes``)."""

    graph_exporter_order = TRACE_FIRST
    graph_output_names: tuple[str, ...] = ()

    def __init__(self, model: nn.Module, axes: dict[str, dict[int, str]], bounds: dict[str, tuple[int, int]]):
        nn.Module.__init__(self)
        self.model = model
        self.graph_dynamic_axes = axes
        self.dim_bounds = {"batch_size": (1, MAX_BATCH), **bounds}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The outputs' dynamic axes by name (a traced graph's output dims take them, as dynamo's do)."""
        return {name: {0: "batch_size"} for name in self.graph_output_names}


class TextEncoder(PipelineGraph):
    """A CLIP / T5 text encoder; CLIP's every hidden state is an output (SD3 takes the penultimate one)."""

    graph_input_names = ("input_ids",)

    def __init__(self, model: nn.Module, hidden_states: bool):
        super().__init__(model, {"input_ids": {0: "batch_size"}}, {})
        self.hidden_states = hidden_states
        layers = int(getattr(model.config, "num_hidden_layers", 0) or 0) if hidden_states else -1
        self.graph_output_names = ("text_embeds", "last_hidden_state", "pooler_output",
                                   *(f"hidden_states.{i}" for i in range(layers + 1)))

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model(input_ids=feed["input_ids"], output_hidden_states=self.hidden_states, return_dict=True)
        named = {k: out[k] for k in ("text_embeds", "last_hidden_state", "pooler_output") if out.get(k) is not None}
        if self.hidden_states:
            named.update({f"hidden_states.{i}": h for i, h in enumerate(out["hidden_states"])})
        return named


def _latent_axes(name: str) -> dict[int, str]:
    """The batch, and the latent height / width (``side_range``)."""
    return {0: "batch_size", 2: "height", 3: "width"}


def _image_axes(name: str) -> dict[int, str]:
    """The batch, and the image's height / width in pixels (the latent's times the VAE's scale factor)."""
    return {0: "batch_size", 2: "image_height", 3: "image_width"}


def _fixed_axes(name: str) -> dict[int, str]:
    """The batch only: SD3's transformer keeps height and width fixed at the example."""
    return {0: "batch_size"}


class SD3Transformer(PipelineGraph):
    graph_input_names = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")
    graph_output_names = ("out_hidden_states",)

    def __init__(self, model: nn.Module, sides: tuple[int, int]):
        axes = {"hidden_states": _fixed_axes("hidden_states"), "encoder_hidden_states": {0: "batch_size"},
                "pooled_projections": {0: "batch_size"}, "timestep": {0: "batch_size"}}
        super().__init__(model, axes, {"height": sides, "width": sides})

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model(hidden_states=feed["hidden_states"], encoder_hidden_states=feed["encoder_hidden_states"],
                         pooled_projections=feed["pooled_projections"], timestep=feed["timestep"], return_dict=False)
        return {"out_hidden_states": out[0]}


ADDED = {None: (), "text_time": ("text_embeds", "time_ids")}  # a UNet's addition_embed_type -> its added inputs
GUIDANCE_EMBEDDING = "timestep_cond"  # an LCM-distilled UNet's guidance-scale embedding (time_cond_proj_dim)


def added_inputs(config: Any) -> tuple[str, ...]:
    """The conditioning a UNet of ``config`` takes beyond the latents, timestep and text, as graph inputs (Optimum's
    names): SDXL's ``added_cond_kwargs`` ``text_embeds`` and ``time_ids``, and an LCM UNet's ``timestep_cond`` (its
    guidance-scale embedding, made on the host); a UNet conditioned on what no exported graph gives (images, class
    labels) is refused by name."""
    from ..errors import OptionsError

    kind = getattr(config, "addition_embed_type", None)
    classes = getattr(config, "class_embed_type", None)
    if kind not in ADDED or classes is not None:
        what = f"addition_embed_type={kind!r}" if kind not in ADDED else f"class_embed_type={classes!r}"
        raise OptionsError(f"the pipeline's UNet has {what}, which this tool does not export (it exports UNets "
                           f"with addition_embed_type {' or '.join(repr(k) for k in ADDED)} and no class "
                           "embedding); export its modules one by one from Python (cann_export.export(pipe.unet, ...))")
    guided = getattr(config, "time_cond_proj_dim", None) is not None
    return (*ADDED[kind], *((GUIDANCE_EMBEDDING,) if guided else ()))


class UNet(PipelineGraph):
    graph_input_names: tuple[str, ...] = ("sample", "timestep", "encoder_hidden_states")

    def __init__(self, model: nn.Module, sides: tuple[int, int]):
        added = added_inputs(model.config)
        axes = {"sample": _latent_axes("sample"), "timestep": {0: "batch_size"},
                "encoder_hidden_states": {0: "batch_size"}, **{n: {0: "batch_size"} for n in added}}
        super().__init__(model, axes, {"height": sides, "width": sides})
        self.added = added
        self.graph_input_names = (*type(self).graph_input_names, *added)

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        added = {n: feed[n] for n in self.added if n != GUIDANCE_EMBEDDING}
        out = self.model(feed["sample"], feed["timestep"], encoder_hidden_states=feed["encoder_hidden_states"],
                         timestep_cond=feed.get(GUIDANCE_EMBEDDING), added_cond_kwargs=added or None,
                         return_dict=False)
        return {"out_sample": out[0]}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The latent out has the latent in's axes."""
        return {"out_sample": _latent_axes("out_sample")}


def _vae_scale(vae: nn.Module) -> int:
    """The VAE's pixels per latent pixel (diffusers' ``vae_scale_factor``)."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


def _traced_as_module(vae: nn.Module, method: str, tensor: torch.Tensor) -> Any:
    """``vae.<method>(tensor, return_dict=False)``; under a TorchScript trace called through the VAE's ``__call__``,
    so the trace records its scope and the nodes' module paths read ``model.decoder...`` as dynamo's do (hints and
    keep sets name ``vae_decoder``'s modules that way: component_hints.py)."""
    bound = getattr(vae, method)
    if not torch.jit.is_tracing():
        return bound(tensor, return_dict=False)
    saved = vae.__dict__.get("forward")
    vae.forward = bound
    try:
        return vae(tensor, return_dict=False)
    finally:
        if saved is None:
            del vae.forward
        else:
            vae.forward = saved


class VaeEncoder(PipelineGraph):
    graph_input_names = ("sample",)
    graph_output_names = ("latent_parameters",)

    def __init__(self, vae: nn.Module, sides: tuple[int, int], scale: int):
        pixels = (sides[0] * scale, sides[1] * scale)
        super().__init__(vae, {"sample": _image_axes("sample")}, {"image_height": pixels, "image_width": pixels})

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"latent_parameters": _traced_as_module(self.model, "encode", feed["sample"])[0].parameters}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The latent's sides are the image's where the VAE does not scale (dynamo's graph names them so)."""
        return {"latent_parameters": _image_axes("latent_parameters") if _vae_scale(self.model) == 1
                else {0: "batch_size"}}


class VaeDecoder(PipelineGraph):
    graph_input_names = ("latent_sample",)
    graph_output_names = ("sample",)

    def __init__(self, vae: nn.Module, sides: tuple[int, int]):
        super().__init__(vae, {"latent_sample": _latent_axes("latent_sample")}, {"height": sides, "width": sides})

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"sample": _traced_as_module(self.model, "decode", feed["latent_sample"])[0]}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The image's sides are the latent's where the VAE does not scale (dynamo's graph names them so)."""
        return {"sample": _latent_axes("sample") if _vae_scale(self.model) == 1 else {0: "batch_size"}}


def denoiser_graph(name: str, model: nn.Module, sides: tuple[int, int]) -> Any:
    return SD3Transformer(model, sides) if name == "transformer" else UNet(model, sides)
