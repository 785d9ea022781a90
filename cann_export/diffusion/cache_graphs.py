"""The denoiser's graphs for a cache (cache_spec.CacheSpec): the full denoiser that also outputs the residual of the
cached range (``cache_residual``, and ``cache_residual_context`` for a DiT's text stream when the range ends before
its last block), the skip graph taking that residual as inputs instead of running the range, and on a DiT with the
threshold policy the probe giving TeaCache's modulated input (``transformer_blocks.0.norm1`` on the embedded
latents and the timestep embedding). Each is the diffusers module itself with the range swapped for a stand-in in a
shallow copy (weights shared, the user's module untouched), so diffusers' own forward runs around it."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .cache_spec import BLOCKS, MID, CacheSpec, residual_names
from .graphs import PipelineGraph, SD3Transformer, UNet


class Residuals:
    """The tensors a stand-in and its graph pass each other during one call. Not a dict on the module: torch.export
    restores a module's tensor attributes after a failed attempt (a copy), which would part the two."""

    __slots__ = ("_tensors",)

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self._tensors[name] = value

    def clear(self) -> None:
        self._tensors = {}

    def update(self, values: dict[str, torch.Tensor]) -> None:
        self._tensors.update(values)


class _RangeFill(nn.Module):
    """DiT blocks ``blocks`` run as one, their residual kept in ``store`` (one per graph, read after the call)."""

    def __init__(self, blocks: list[nn.Module], store: Residuals):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.store = store
        self.context_pre_only = blocks[-1].context_pre_only

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor,
                joint_attention_kwargs: Any = None) -> tuple[Any, torch.Tensor]:
        hidden, context = hidden_states, encoder_hidden_states
        for block in self.blocks:
            context, hidden = block(hidden_states=hidden, encoder_hidden_states=context, temb=temb,
                                    joint_attention_kwargs=joint_attention_kwargs)
        self.store["cache_residual"] = hidden - hidden_states
        if context is not None:
            self.store["cache_residual_context"] = context - encoder_hidden_states
        return context, hidden


class _RangeSkip(nn.Module):
    """The range not run: its inputs plus the stored residuals (``store``, set from the graph's inputs)."""

    def __init__(self, context_pre_only: bool, store: Residuals):
        super().__init__()
        self.context_pre_only = context_pre_only
        self.store = store

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor,
                joint_attention_kwargs: Any = None) -> tuple[Any, torch.Tensor]:
        context = None if self.context_pre_only else encoder_hidden_states + self.store["cache_residual_context"]
        return context, hidden_states + self.store["cache_residual"]


class _MidFill(nn.Module):
    def __init__(self, mid: nn.Module, store: Residuals):
        super().__init__()
        self.mid = mid
        self.store = store
        self.has_cross_attention = getattr(mid, "has_cross_attention", False)

    def forward(self, sample: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.mid(sample, *args, **kwargs)
        self.store["cache_residual"] = out - sample
        return out


class _MidSkip(nn.Module):
    def __init__(self, has_cross_attention: bool, store: Residuals):
        super().__init__()
        self.store = store
        self.has_cross_attention = has_cross_attention

    def forward(self, sample: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        return sample + self.store["cache_residual"]


def _swapped(model: nn.Module, spec: CacheSpec, stand_in: nn.Module) -> nn.Module:
    """A shallow copy of ``model`` with the cached range replaced by ``stand_in`` (the same parameters)."""
    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    if spec.module == MID:
        clone._modules[MID] = stand_in
        return clone
    blocks = list(getattr(model, BLOCKS))
    clone._modules[BLOCKS] = nn.ModuleList([*blocks[:spec.start], stand_in, *blocks[spec.end:]])
    return clone


def _cached_blocks(model: nn.Module, spec: CacheSpec) -> list[nn.Module]:
    return list(getattr(model, BLOCKS))[spec.start:spec.end]


def _fill_model(model: nn.Module, spec: CacheSpec, store: Residuals) -> nn.Module:
    if spec.module == MID:
        return _swapped(model, spec, _MidFill(getattr(model, MID), store))
    return _swapped(model, spec, _RangeFill(_cached_blocks(model, spec), store))


def _skip_model(model: nn.Module, spec: CacheSpec, store: Residuals) -> nn.Module:
    if spec.module == MID:
        return _swapped(model, spec, _MidSkip(getattr(getattr(model, MID), "has_cross_attention", False), store))
    return _swapped(model, spec, _RangeSkip(_cached_blocks(model, spec)[-1].context_pre_only, store))


def _residual_axes(names: tuple[str, ...]) -> dict[str, dict[int, str]]:
    return {n: {0: "batch_size"} for n in names}


# the cache's graphs keep dynamo first (the plain components trace first: graphs.PipelineGraph): a traced residual
# output's dims would take the tracer's own names (a UNet's mid-block residual has the latent's sides / 2^k), which
# validate cannot size when it re-derives the parity budget from the graph's dims
DYNAMO_FIRST: tuple[str, ...] = ()


class _Fill:
    """The full denoiser plus the residuals its stand-in kept (``store``)."""

    graph_exporter_order = DYNAMO_FIRST
    store: Residuals
    residuals: tuple[str, ...]

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.store.clear()
        out = super().compute(feed)  # type: ignore[misc]
        return {**out, **{n: self.store[n] for n in self.residuals}}


class _Skip:
    """The denoiser whose stand-in adds the residuals given as inputs (``store``)."""

    graph_exporter_order = DYNAMO_FIRST
    store: Residuals
    residuals: tuple[str, ...]

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.store.clear()
        self.store.update({n: feed[n] for n in self.residuals})
        return super().compute(feed)  # type: ignore[misc]


class FullSD3(_Fill, SD3Transformer):
    pass


class FullUNet(_Fill, UNet):
    pass


class SkipSD3(_Skip, SD3Transformer):
    pass


class SkipUNet(_Skip, UNet):
    pass


def full_graph(name: str, model: nn.Module, sides: tuple[int, int], spec: CacheSpec) -> PipelineGraph:
    """The denoiser's graph (Optimum's names) that also outputs the cached range's residuals."""
    store = Residuals()
    graph = (FullSD3 if name == "transformer" else FullUNet)(_fill_model(model, spec, store), sides)
    graph.store, graph.residuals = store, residual_names(spec)
    return graph


def skip_graph(name: str, model: nn.Module, sides: tuple[int, int], spec: CacheSpec) -> PipelineGraph:
    """The denoiser without the cached range: its residuals are inputs, added where the range would have run."""
    store = Residuals()
    cls = SkipSD3 if name == "transformer" else SkipUNet
    graph = cls(_skip_model(model, spec, store), sides)
    graph.store, graph.residuals = store, residual_names(spec)
    graph.graph_input_names = (*graph.graph_input_names, *graph.residuals)
    graph.graph_dynamic_axes.update(_residual_axes(graph.residuals))
    if name != "transformer":  # a UNet's mid-block residual has the latent's sides / 2^k, which no dimension label
        graph.graph_dynamic_axes["sample"] = {0: "batch_size"}  # (NAME + k) can say: its sides stay the example's
    return graph


class Probe(PipelineGraph):
    """TeaCache's measure on SD3: the first block's AdaLayerNorm of the embedded latents under the timestep
    embedding (``modulated_input``); a runtime compares it between steps to decide whether to skip."""

    graph_input_names = ("hidden_states", "pooled_projections", "timestep")
    graph_exporter_order = DYNAMO_FIRST

    def __init__(self, model: nn.Module, sides: tuple[int, int]):
        axes = {n: {0: "batch_size"} for n in self.graph_input_names}
        super().__init__(model, axes, {"height": sides, "width": sides})

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.model.pos_embed(feed["hidden_states"])
        temb = self.model.time_text_embed(feed["timestep"], feed["pooled_projections"])
        modulated = getattr(self.model, BLOCKS)[0].norm1(hidden, emb=temb)[0]
        return {"modulated_input": modulated}
