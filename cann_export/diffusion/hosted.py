"""The exported graphs standing in for a diffusers pipeline's modules, so diffusers' own ``__call__`` (its
tokenizers, scheduler, guidance and image post-processing on the host) runs them: each stand-in is an
``nn.Module`` with the module's ``config``, ``dtype`` and call signature, running its graph in onnxruntime (fp32)
or under the device emulation, and counting the NaN / Inf its graph gave."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class Hosted(nn.Module):
    """One graph behind a module's interface: ``run`` maps input arrays by name to output arrays by name."""

    def __init__(self, name: str, run: Run, config: Any):
        super().__init__()
        self.component = name
        self.graph_run = run
        self.config = config
        self.nonfinite = 0  # NaN / Inf values the graph gave over the run
        self.register_buffer("anchor", torch.zeros(()), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def call(self, **feed: Any) -> dict[str, torch.Tensor]:
        arrays = {k: v.detach().cpu().numpy() for k, v in feed.items()}
        out = self.graph_run(arrays)
        for v in out.values():
            if np.issubdtype(v.dtype, np.floating):
                self.nonfinite += int(v.size - np.count_nonzero(np.isfinite(v)))
        return {k: torch.from_numpy(np.array(v)) for k, v in out.items()}


class HostedTextEncoder(Hosted):
    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, output_hidden_states: bool = False,
                **_: Any) -> Any:
        from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
        from transformers.models.clip.modeling_clip import CLIPTextModelOutput

        out = self.call(input_ids=input_ids.to(torch.int64))
        from .planner import hidden_state_names

        hidden = tuple(out[k] for k in hidden_state_names(list(out))) or None
        if "text_embeds" in out:
            return CLIPTextModelOutput(text_embeds=out["text_embeds"], last_hidden_state=out["last_hidden_state"],
                                       hidden_states=hidden)
        if "pooler_output" in out:
            return BaseModelOutputWithPooling(last_hidden_state=out["last_hidden_state"],
                                              pooler_output=out["pooler_output"], hidden_states=hidden)
        return BaseModelOutput(last_hidden_state=out["last_hidden_state"], hidden_states=hidden)


def _steps(timestep: Any, batch: int) -> torch.Tensor:
    t = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1)
    return t.expand(batch).contiguous() if t.numel() == 1 else t


class HostedDenoiser(Hosted):
    """The denoiser's graph; ``limits``: the latent sides every graph of the loop takes (diffusion/sides.py), checked
    before a run at a size they cannot take."""

    limits: dict[str, tuple[int, int]] | None = None
    scale: int = 1

    def check(self, latents: torch.Tensor) -> None:
        from .sides import check_latents

        if self.limits:
            check_latents(latents, self.scale, self.limits)


class HostedTransformer(HostedDenoiser):
    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                pooled_projections: torch.Tensor, timestep: Any, return_dict: bool = False, **_: Any) -> Any:
        self.check(hidden_states)
        out = self.call(hidden_states=hidden_states.float(), encoder_hidden_states=encoder_hidden_states.float(),
                        pooled_projections=pooled_projections.float(),
                        timestep=_steps(timestep, hidden_states.shape[0]))
        return (out["out_hidden_states"],)


class HostedUNet(HostedDenoiser):
    """A UNet's graph; one conditioned on ``added_cond_kwargs`` (SDXL's ``text_embeds`` and ``time_ids``) takes them
    as graph inputs, and shows the width of its ``add_embedding`` (SDXL's ``_get_add_time_ids`` checks it)."""

    def __init__(self, name: str, run: Run, config: Any):
        from types import SimpleNamespace

        from .graphs import added_inputs

        super().__init__(name, run, config)
        self.added = added_inputs(config)
        if "time_ids" in self.added:
            width = int(config.projection_class_embeddings_input_dim)
            self.add_embedding = SimpleNamespace(linear_1=SimpleNamespace(in_features=width))

    def forward(self, sample: torch.Tensor, timestep: Any, encoder_hidden_states: torch.Tensor, *_: Any,
                timestep_cond: torch.Tensor | None = None, added_cond_kwargs: dict[str, torch.Tensor] | None = None,
                return_dict: bool = False, **__: Any) -> Any:
        from .graphs import GUIDANCE_EMBEDDING

        self.check(sample)
        given = {**(added_cond_kwargs or {}), GUIDANCE_EMBEDDING: timestep_cond}
        added = {n: given[n].float() for n in self.added}
        out = self.call(sample=sample.float(), timestep=_steps(timestep, sample.shape[0]),
                        encoder_hidden_states=encoder_hidden_states.float(), **added)
        return (out["out_sample"],)


class HostedVae(Hosted):
    """``vae_decoder`` as ``vae.decode`` and ``vae_encoder`` (``encoder_run``) as ``vae.encode``."""

    def __init__(self, run: Run, config: Any, encoder_run: Run | None = None):
        super().__init__("vae_decoder", run, config)
        self.encoder_run = encoder_run

    def decode(self, z: torch.Tensor, return_dict: bool = False, **_: Any) -> Any:
        return (self.call(latent_sample=z.float())["sample"],)

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKLOutput
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

        if self.encoder_run is None:
            raise RuntimeError("this runner has no vae_encoder graph")
        params = torch.from_numpy(self.encoder_run({"sample": x.float().numpy()})["latent_parameters"])
        dist = DiagonalGaussianDistribution(params)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)


HOSTED = {"transformer": HostedTransformer, "unet": HostedUNet}


def ort_run(path: str, arena: bool = True) -> Run:
    """onnxruntime on the graph at ``path`` (fp32, CPU); ``arena``: the session keeps its largest run's memory for
    the next (a runner's loop), else each run's intermediates go back after it."""
    import onnxruntime as ort

    from ..graph.onnx_helpers import session_options

    return _named_run(ort.InferenceSession(path, session_options(arena=arena), providers=["CPUExecutionProvider"]))


def _named_run(sess: Any) -> Run:
    names = [o.name for o in sess.get_outputs()]
    wanted = [i.name for i in sess.get_inputs()]

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(names, {n: feed[n] for n in wanted}), strict=True))

    return run


def fp32_run(path: str, module: Any = None, arena: bool = False) -> Run:
    """ort_run, except that a graph whose weights are in its external-data file (``model.onnx.data``: a large
    graph, capture/large_graph.py) is fed ``module``'s tensors (the pipeline's own part) where the file holds the
    same bytes, so the weights are held once, by the pipeline."""
    from pathlib import Path

    from ..capture.large_graph import fed_session

    graph = Path(path)
    large = module is not None and graph.with_name(graph.name + ".data").is_file()
    sess = fed_session(graph, module) if large else None
    return ort_run(path, arena=arena) if sess is None else _named_run(sess)


def source_module(pipe: Any, name: str) -> nn.Module | None:
    """The part of ``pipe`` whose weights component ``name``'s graph holds (both VAE graphs: ``vae``; a cache's
    graphs, ``transformer_cache_skip``: their denoiser)."""
    module = getattr(pipe, "vae" if name.startswith("vae_") else name.split("_cache_")[0], None)
    return module if isinstance(module, nn.Module) else None


def emulated_run(path: str, mode: str, overflow: str, keep: list[str]) -> Run:
    """The graph at ``path`` computed as the device does under precision ``mode`` and the SoC's ``overflow``
    mode, ``keep`` (its keep_dtype nodes) in fp32: the emulation its device parity used."""
    from pathlib import Path

    from ..validators.device_parity_run import expand_keep
    from ..validators.precision import Emulator, fed_weights

    model, weights = fed_weights(Path(path))  # onnx.load held the file's bytes, the graph's and the fed copies
    emulator = Emulator(model, mode, overflow, fed=weights)
    sess = emulator.session(expand_keep(keep, {}))
    names = [o.name for o in model.graph.output]

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(feed, names), strict=True))

    return run


class OneOpen:
    """Graph runs (``lazy``) that open their graph when first called and share one place: opening one closes the
    one open before it, so a loop over a pipeline's components holds one component's session (and its emulator's
    weights) at a time, not every component's at once. A closed run opens again when it is next called."""

    def __init__(self) -> None:
        self.open: _LazyRun | None = None

    def lazy(self, opener: Callable[[], Run]) -> Run:
        """A run that calls ``opener`` for the real one when first called (again after another run opened)."""
        return _LazyRun(opener, self)

    def close(self) -> None:
        """The open run closed and its memory given back to the operating system."""
        from ..heap_release import give_back

        if self.open is not None:
            self.open.run = None
            self.open = None
            give_back()


class _LazyRun:
    def __init__(self, opener: Callable[[], Run], slot: OneOpen):
        self.opener = opener
        self.slot = slot
        self.run: Run | None = None

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.run is None:
            from ..heap_release import give_back

            self.slot.close()
            self.run = self.opener()
            self.slot.open = self
            give_back()  # what building it held only for a while (the graph's bytes, its proto)
        return self.run(feed)


PIPELINE_FLAGS = ("force_zeros_for_empty_prompt",)  # the pipeline's own settings (model_index.json), if booleans


def pipeline_flags(config: Any) -> dict[str, bool]:
    """The settings of PIPELINE_FLAGS a pipeline's config (or its model_index.json) records as booleans."""
    return {k: config[k] for k in PIPELINE_FLAGS if isinstance(config, dict) and isinstance(config.get(k), bool)}


def hosted_pipeline(cls: str, parts: dict[str, Any], runs: dict[str, Run], configs: dict[str, Any],
                    cached: Any = None, limits: dict[str, tuple[int, int]] | None = None,
                    flags: dict[str, bool] | None = None) -> Any:
    """A diffusers ``cls`` pipeline whose model parts are the graphs' ``runs`` (by component name); ``parts``: its
    scheduler and tokenizers; ``configs``: each model part's config (``vae`` for both VAE graphs); ``cached``: a
    denoiser applying a cache (cached_denoiser) in place of the plain one; ``limits``: the latent sides the graphs
    take (checked before the denoiser runs); ``flags``: the source pipeline's pipeline_flags."""
    import diffusers

    from .known_pipelines import PIPELINES

    encoders, denoiser = PIPELINES[cls]
    modules: dict[str, Any] = {e: HostedTextEncoder(e, runs[e], configs[e]) for e in encoders}
    modules[denoiser] = cached if cached is not None else HOSTED[denoiser](denoiser, runs[denoiser],
                                                                           configs[denoiser])
    modules["vae"] = HostedVae(runs["vae_decoder"], configs["vae"], runs.get("vae_encoder"))
    extra = {"requires_safety_checker": False, "safety_checker": None, "feature_extractor": None} \
        if cls == "StableDiffusionPipeline" else {}
    pipe = getattr(diffusers, cls)(**modules, **parts, **extra, **(flags or {}))
    pipe.set_progress_bar_config(disable=True)
    modules[denoiser].limits, modules[denoiser].scale = limits, int(pipe.vae_scale_factor)
    return pipe


def nonfinite(pipe: Any) -> dict[str, int]:
    """The NaN / Inf count of each stand-in's graph over the runs so far (the VAE: vae_decoder)."""
    return {m.component: m.nonfinite for m in pipe.components.values() if isinstance(m, Hosted)}
