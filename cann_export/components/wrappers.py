"""Flat-tensor wrappers around transformers models: the graphs a deployed decoder runs (prefill, decode, a
fixed-length decode) and an encoder-decoder's three graphs, with Optimum's input and output names
(``past_key_values.{i}.key`` in, ``present.{i}.key`` out; ``.decoder`` / ``.encoder`` for encoder-decoders).

A wrapper takes tensors only (positionally in ``graph_input_names`` order for capture, or by name in eager
calls) and returns a dict of tensors, so torch.onnx sees no Cache object and no Python branch on the cache:
each graph is one straight computation, never an ``If``-merged prefill/decode graph."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def num_layers(config: Any) -> int:
    """The decoder's layer count (``num_decoder_layers`` for encoder-decoders)."""
    for key in ("num_decoder_layers", "num_hidden_layers", "n_layer", "num_layers", "decoder_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError("the config names no layer count (num_hidden_layers / n_layer / num_layers)")


def kv_names(layers: int, prefix: str, parts: tuple[str, ...] = ("",)) -> list[str]:
    """``{prefix}.{i}[.{part}].key/value`` for every layer, in Optimum's order."""
    return [f"{prefix}.{i}{'.' + part if part else ''}.{kv}" for i in range(layers) for part in parts
            for kv in ("key", "value")]


MAX_BATCH = 64


def max_positions(config: Any) -> int:
    """The longest sequence the model takes (its position table), 4096 for relative positions (T5)."""
    for key in ("n_positions", "max_position_embeddings", "max_target_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 2:
            return value
    return 4096


class _Graph(nn.Module):
    """A graph over named tensors: ``graph_input_names`` in order (capture passes them positionally), and
    ``graph_dynamic_axes``: per input, the axes that vary (Optimum's axis names; ``NAME + 1`` for an axis one
    longer than NAME), with ``dim_bounds`` (name -> (min, max))."""

    graph_input_names: tuple[str, ...] = ()

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.graph_dynamic_axes: dict[str, dict[int, str]] = {}
        seq = max_positions(model.config)
        self.dim_bounds: dict[str, tuple[int, int]] = {"batch_size": (1, MAX_BATCH)}
        for name in ("sequence_length", "encoder_sequence_length", "decoder_sequence_length"):
            self.dim_bounds[name] = (1, seq)
        for name in ("past_sequence_length", "past_decoder_sequence_length"):
            self.dim_bounds[name] = (1, seq - 1)

    def graph_dynamic_shapes(self) -> tuple[dict[int, Any], ...]:
        """``graph_dynamic_axes`` as torch.export Dims, one dict per input in order (for torch.onnx.export)."""
        from torch.export import Dim

        dims: dict[str, Any] = {}

        def dim(label: str) -> Any:
            base, _, plus = label.partition(" + ")
            if base not in dims:
                low, high = self.dim_bounds[base]
                dims[base] = Dim(base, min=low, max=high)
            return dims[base] + int(plus) if plus else dims[base]

        return tuple({axis: dim(label) for axis, label in self.graph_dynamic_axes.get(n, {}).items()}
                     for n in self.graph_input_names)

    def shape_ranges(self, feed: dict[str, torch.Tensor], brackets: bool = True) -> str:
        """ATC's ranges for the dynamic axes, static axes as is: ``name:[lo~hi,...]`` per input (the
        ``input_shape_range`` of CANN < 8), or ``name:lo~hi,...`` (``input_shape`` of CANN >= 8)."""
        parts = []
        for name in self.graph_input_names:
            axes = self.graph_dynamic_axes.get(name, {})
            dims = []
            for axis, size in enumerate(feed[name].shape):
                if axis not in axes:
                    dims.append(str(size))
                    continue
                base, _, plus = axes[axis].partition(" + ")
                low, high = self.dim_bounds[base]
                dims.append(f"{low + int(plus or 0)}~{high + int(plus or 0)}")
            parts.append(f"{name}:[{','.join(dims)}]" if brackets else f"{name}:{','.join(dims)}")
        return ";".join(parts)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        feed = dict(zip(self.graph_input_names, args, strict=False))
        feed.update(kwargs)
        missing = [n for n in self.graph_input_names if n not in feed]
        if missing:
            raise TypeError(f"missing inputs {', '.join(missing)}")
        return self.compute(feed)

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The graph's outputs by name from its inputs by name: each graph class (prefill, decode, ...) defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines no compute(): every graph class must")


def _dynamic_cache(flat: list[torch.Tensor], config: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for i in range(len(flat) // 2):
        cache.update(flat[2 * i], flat[2 * i + 1], i)
    return cache


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_of(out: Any) -> Any:
    return getattr(out, "past_key_values", None) if getattr(out, "past_key_values", None) is not None \
        else getattr(out, "cache", None)


class DecoderPrefill(_Graph):
    """``input_ids, attention_mask, position_ids -> logits, present.*``: the prompt, no past in."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_input_names = ("input_ids", "attention_mask", "position_ids")
        self.graph_dynamic_axes = {n: {0: "batch_size", 1: "sequence_length"} for n in self.graph_input_names}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from transformers import DynamicCache

        out = self.model(**feed, past_key_values=DynamicCache(config=self.model.config), use_cache=True)
        flat = [t for kv in _layers(_cache_of(out)) for t in kv]
        return {"logits": out.logits, **dict(zip(kv_names(len(flat) // 2, "present"), flat, strict=True))}


class DecoderStep(_Graph):
    """``input_ids (new tokens), attention_mask (past + new), position_ids, past_key_values.* -> logits,
    present.*``: a decode step on a growing cache (``present`` = past + the new tokens)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.past = kv_names(num_layers(model.config), "past_key_values")
        self.graph_input_names = ("input_ids", "attention_mask", "position_ids", *self.past)
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size"}, "position_ids": {0: "batch_size"},
                                   "attention_mask": {0: "batch_size", 1: "past_sequence_length + 1"},
                                   **{n: {0: "batch_size", 2: "past_sequence_length"} for n in self.past}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cache = _dynamic_cache([feed[n] for n in self.past], self.model.config)
        out = self.model(input_ids=feed["input_ids"], attention_mask=feed["attention_mask"],
                         position_ids=feed["position_ids"], past_key_values=cache, use_cache=True)
        flat = [t for kv in _layers(_cache_of(out)) for t in kv]
        return {"logits": out.logits, **dict(zip(kv_names(len(flat) // 2, "present"), flat, strict=True))}


class StaticPrefill(DecoderPrefill):
    """The fixed-length prompt: exactly as many tokens as the cache has slots, left-padded (``attention_mask``
    0). A padding position attends to nothing, so what a runtime computes there is arbitrary: its logits and
    cache slots are zeros, the same in every runtime (decode masks those slots anyway)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_dynamic_axes = {}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = super().compute(feed)
        keep = feed["attention_mask"] != 0
        return {k: torch.where(keep[:, :, None] if k == "logits" else keep[:, None, :, None], v, torch.zeros_like(v))
                for k, v in out.items()}


class StaticDecoderStep(DecoderStep):
    """The fixed-length form for ATC's static-shape path: ``past_key_values.*`` hold exactly ``length``
    slots (unused ones masked by ``attention_mask`` = 0, which covers the slots and the new token:
    ``length + 1``) and ``present.*`` is the window shifted by one: the oldest slot drops, the new token's
    key/value enters last, so every shape is the same at every step."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_dynamic_axes = {}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = super().compute(feed)
        return {k: (v if k == "logits" else v[:, :, 1:, :]) for k, v in out.items()}


def _seq2seq_cache(self_kv: list[torch.Tensor], cross_kv: list[torch.Tensor], config: Any) -> Any:
    from transformers import EncoderDecoderCache

    return EncoderDecoderCache(_dynamic_cache(self_kv, config), _dynamic_cache(cross_kv, config))


class Seq2SeqEncoder(_Graph):
    """``input_ids, attention_mask -> last_hidden_state`` (Optimum's encoder_model)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_input_names = ("input_ids", "attention_mask")
        self.graph_dynamic_axes = {n: {0: "batch_size", 1: "encoder_sequence_length"} for n in self.graph_input_names}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model.get_encoder()(input_ids=feed["input_ids"], attention_mask=feed["attention_mask"])
        return {"last_hidden_state": out.last_hidden_state}


class Seq2SeqDecoder(_Graph):
    """``input_ids (decoder), encoder_attention_mask, encoder_hidden_states -> logits,
    present.{i}.decoder/encoder.key/value`` (Optimum's decoder_model: the first step, no past in)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_input_names = ("input_ids", "encoder_attention_mask", "encoder_hidden_states")
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size", 1: "decoder_sequence_length"},
                                   "encoder_attention_mask": {0: "batch_size", 1: "encoder_sequence_length"},
                                   "encoder_hidden_states": {0: "batch_size", 1: "encoder_sequence_length"}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cache = _seq2seq_cache([], [], self.model.config)
        out = self.model(encoder_outputs=(feed["encoder_hidden_states"],),
                         attention_mask=feed["encoder_attention_mask"], decoder_input_ids=feed["input_ids"],
                         past_key_values=cache, use_cache=True)
        return {"logits": out.logits, **_seq2seq_present(_cache_of(out))}


def _seq2seq_present(cache: Any, encoder: bool = True) -> dict[str, torch.Tensor]:
    self_layers, cross_layers = _layers(cache.self_attention_cache), _layers(cache.cross_attention_cache)
    out = {}
    for i, (k, v) in enumerate(self_layers):
        out[f"present.{i}.decoder.key"], out[f"present.{i}.decoder.value"] = k, v
        if encoder:
            out[f"present.{i}.encoder.key"], out[f"present.{i}.encoder.value"] = cross_layers[i]
    return out


class Seq2SeqDecoderWithPast(_Graph):
    """``input_ids (one token), encoder_attention_mask, past_key_values.{i}.decoder/encoder.* -> logits,
    present.{i}.decoder.*`` (Optimum's decoder_with_past_model: the cross-attention keys/values come from the
    first decoder step, so the encoder's hidden states are not an input)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        layers = num_layers(model.config)
        self.past = kv_names(layers, "past_key_values", ("decoder", "encoder"))
        self.graph_input_names = ("input_ids", "encoder_attention_mask", *self.past)
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size"},
                                   "encoder_attention_mask": {0: "batch_size", 1: "encoder_sequence_length"},
                                   **{n: {0: "batch_size", 2: "past_decoder_sequence_length" if ".decoder." in n
                                          else "encoder_sequence_length"} for n in self.past}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        own = [feed[n] for n in self.past if ".decoder." in n]
        cross = [feed[n] for n in self.past if ".encoder." in n]
        cache = _seq2seq_cache(own, cross, self.model.config)
        mask = feed["encoder_attention_mask"]
        # the hidden states are read only for their shape once the cross-attention cache is filled
        hidden = cross[0].new_zeros((mask.shape[0], mask.shape[1], self.model.config.d_model))
        out = self.model(encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=feed["input_ids"],
                         past_key_values=cache, use_cache=True)
        return {"logits": out.logits, **_seq2seq_present(_cache_of(out), encoder=False)}
