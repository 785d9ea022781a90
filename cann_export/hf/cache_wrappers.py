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


def _part(config: Any, name: str) -> Any:
    """A composite encoder-decoder's own config of its ``name`` part (VisionEncoderDecoder's ``config.encoder`` /
    ``config.decoder``: layers, positions, vocabulary, width), else ``config`` itself (T5, BART, Whisper keep one)."""
    sub = getattr(config, name, None)
    return sub if sub is not None and callable(getattr(sub, "to_dict", None)) else config


def decoder_config(config: Any) -> Any:
    return _part(config, "decoder")


def encoder_width(config: Any) -> int:
    """The width of the encoder's hidden states as the decoder graph takes them (before a composite model's
    projection to the decoder's width)."""
    config = _part(config, "encoder")
    return getattr(config, "d_model", None) or config.hidden_size


def num_layers(config: Any) -> int:
    """The decoder's layer count (``num_decoder_layers`` / ``decoder_layers`` for encoder-decoders: Whisper's and
    BART's ``num_hidden_layers`` is the encoder's)."""
    config = decoder_config(config)
    for key in ("num_decoder_layers", "decoder_layers", "num_hidden_layers", "n_layer", "num_layers", "decoder_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError("the config names no layer count (num_hidden_layers / n_layer / num_layers)")


def kv_names(layers: int, prefix: str, parts: tuple[str, ...] = ("",)) -> list[str]:
    """``{prefix}.{i}[.{part}].key/value`` for every layer, in Optimum's order."""
    return [f"{prefix}.{i}{'.' + part if part else ''}.{kv}" for i in range(layers) for part in parts
            for kv in ("key", "value")]


MAX_BATCH = 64


def max_positions(config: Any, keys: tuple[str, ...] = ("n_positions", "max_position_embeddings",
                                                         "max_target_positions")) -> int:
    """The longest sequence the model takes (its position table), 4096 for relative positions (T5); ``keys``:
    the config fields that may say it, first found wins."""
    for key in keys:
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
        seq = max_positions(decoder_config(model.config))
        window = sliding_window(model.config)
        self.dim_bounds: dict[str, tuple[int, int]] = {"batch_size": (1, MAX_BATCH)}
        for name in ("sequence_length", "decoder_sequence_length"):
            self.dim_bounds[name] = (1, seq if window is None else min(seq, window - 1))
        # the encoder's own positions where it has a table of its own (Whisper's max_source_positions)
        encoder_keys = ("max_source_positions", "n_positions", "max_position_embeddings", "max_target_positions")
        self.dim_bounds["encoder_sequence_length"] = (1, max_positions(_part(model.config, "encoder"), encoder_keys))
        for name in ("past_sequence_length", "past_decoder_sequence_length"):
            self.dim_bounds[name] = (1, seq - 1 if window is None else min(seq - 1, window - 2))

    def take_tokens(self, tokens: int) -> None:
        """A decode graph of ``tokens`` new tokens per step: the past holds ``tokens - 1`` fewer at most, so past and
        new together stay within the position table (or the sliding window)."""
        for name in ("past_sequence_length", "past_decoder_sequence_length"):
            low, high = self.dim_bounds[name]
            self.dim_bounds[name] = (low, high - (tokens - 1))

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


def sliding_window(config: Any) -> int | None:
    """The smallest sliding window of the decoder's cache layers (transformers' DynamicSlidingWindowLayer keeps only
    the last ``window - 1`` tokens: Mistral, Gemma2/3, Phi-3, ...), or None. Past that length the cache, the
    attention mask and the path the graph was captured on all change, so a graph covers contexts up to it: the
    prompt ``window - 1`` tokens, the past ``window - 2`` (checked on Mistral and Gemma2 with a window of 8: past
    it the decode graph was wrong on left-padded rows, or failed in onnxruntime)."""
    from transformers import DynamicCache

    try:
        layers = DynamicCache(config=cache_config(config)).layers
    except Exception:  # noqa: BLE001 - a config the cache cannot read has no window we can know
        return None
    windows = [w for layer in layers if isinstance(w := getattr(layer, "sliding_window", None), int) and w > 0]
    return min(windows) if windows else None


def _dynamic_cache(flat: list[torch.Tensor], config: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for i in range(len(flat) // 2):
        cache.update(flat[2 * i], flat[2 * i + 1], i)
    return cache


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if cache is None or not hasattr(cache, "layers"):
        from ..errors import OptionsError

        raise OptionsError(f"the model returned {type(cache).__name__ if cache is not None else 'no'} cache where a "
                           "decoder returns its keys and values, so it has no prefill + decode graphs; export one "
                           "graph with --task text-generation (no cache)")
    other = sorted({type(layer).__name__ for layer in cache.layers
                    if not (isinstance(getattr(layer, "keys", None), torch.Tensor)
                            and isinstance(getattr(layer, "values", None), torch.Tensor))})
    if other:  # a state-space / linear-attention model (Mamba): its cache is a recurrent state, not keys and values
        from ..errors import OptionsError

        raise OptionsError(f"the model's cache holds {', '.join(other)} layers, not attention keys and values, so it "
                           "has no prefill + decode graphs with past_key_values; export one graph with --task "
                           "text-generation (no cache)")
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_of(out: Any) -> Any:
    return getattr(out, "past_key_values", None) if getattr(out, "past_key_values", None) is not None \
        else getattr(out, "cache", None)


# Optimum's capture for a decoder's and an encoder-decoder's graphs (``graph_exporter_order``, passed on by the load
# stage as ``extras["exporter_order"]``): a TorchScript trace with the declared axes; one that warned (the cache and
# mask code do) is kept only after the trace gate checked it at the example and at each dimension's range points
# (capture/exporter_choice.py), else dynamo runs; parity judges every set on the written graph either way (tiny T5:
# its three graphs' capture 52 s under dynamo, 7 s traced)
TRACE_FIRST = ("torchscript", "dynamo")


class DecoderPrefill(_Graph):
    """``input_ids, attention_mask, position_ids -> logits, present.*``: the prompt, no past in."""

    graph_exporter_order = TRACE_FIRST

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.graph_input_names = ("input_ids", "attention_mask", "position_ids")
        self.graph_dynamic_axes = {n: {0: "batch_size", 1: "sequence_length"} for n in self.graph_input_names}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The outputs' dynamic axes by name (a traced graph's output dims take them, as dynamo's do)."""
        present = kv_names(num_layers(self.model.config), "present")
        length = self.graph_dynamic_axes.get("input_ids", {}).get(1)
        if length is None:  # a fixed-length form: no dynamic axis
            return {}
        return {"logits": {0: "batch_size", 1: length}, **{n: {0: "batch_size", 2: length} for n in present}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from transformers import DynamicCache

        out = self.model(**feed, past_key_values=DynamicCache(config=self.model.config), use_cache=True)
        flat = [t for kv in _layers(_cache_of(out)) for t in kv]
        return {"logits": out.logits, **dict(zip(kv_names(len(flat) // 2, "present"), flat, strict=True))}


class DecoderStep(_Graph):
    """``input_ids (new tokens), attention_mask (past + new), position_ids, past_key_values.* -> logits,
    present.*``: a decode step on a growing cache (``present`` = past + the new tokens); ``tokens``: how many new
    tokens it takes (one by default; N for chunked prefill and speculative decoding's drafts)."""

    graph_exporter_order = TRACE_FIRST

    def __init__(self, model: nn.Module, tokens: int = 1):
        super().__init__(model)
        self.tokens = tokens
        self.take_tokens(tokens)
        self.past = kv_names(num_layers(model.config), "past_key_values")
        self.graph_input_names = ("input_ids", "attention_mask", "position_ids", *self.past)
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size"}, "position_ids": {0: "batch_size"},
                                   "attention_mask": {0: "batch_size", 1: f"past_sequence_length + {tokens}"},
                                   **{n: {0: "batch_size", 2: "past_sequence_length"} for n in self.past}}

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """The outputs' dynamic axes by name: ``present.*`` hold the past and the new token."""
        if not self.graph_dynamic_axes:
            return {}
        present = [n.replace("past_key_values.", "present.", 1) for n in self.past]
        total = f"past_sequence_length + {self.tokens}"
        return {"logits": {0: "batch_size"}, **{n: {0: "batch_size", 2: total} for n in present}}

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


def cache_config(config: Any) -> Any:
    """``config`` as DynamicCache(config=...) should read it: one layer per decoder layer (Whisper's and BART's
    ``num_hidden_layers`` counts the encoder's), a copy only where they differ."""
    import copy

    config = decoder_config(config)
    layers = num_layers(config)
    if getattr(config, "num_hidden_layers", layers) == layers:
        return config
    config = copy.deepcopy(config)
    config.num_hidden_layers = layers
    return config


def _seq2seq_cache(self_kv: list[torch.Tensor], cross_kv: list[torch.Tensor], config: Any) -> Any:
    from transformers import EncoderDecoderCache

    return EncoderDecoderCache(_dynamic_cache(self_kv, config), _dynamic_cache(cross_kv, config))


class Seq2SeqEncoder(_Graph):
    """``<the encoder's inputs> -> last_hidden_state`` (Optimum's encoder_model): ``inputs`` names them with their
    dynamic axes, e.g. ``input_ids, attention_mask`` (T5), ``input_features`` (Whisper), ``pixel_values``."""

    def __init__(self, model: nn.Module, inputs: dict[str, dict[int, str]] | None = None):
        super().__init__(model)
        if inputs is None:
            inputs = {n: {0: "batch_size", 1: "encoder_sequence_length"} for n in ("input_ids", "attention_mask")}
        self.graph_input_names = tuple(inputs)
        self.graph_dynamic_axes = {n: dict(axes) for n, axes in inputs.items()}

    graph_exporter_order = TRACE_FIRST

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """``last_hidden_state``: the batch, and the sequence where the inputs' is dynamic."""
        length = next((a[1] for a in self.graph_dynamic_axes.values() if a.get(1) == "encoder_sequence_length"), None)
        return {"last_hidden_state": {0: "batch_size", **({1: length} if length else {})}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.model.get_encoder()(**{n: feed[n] for n in self.graph_input_names})
        return {"last_hidden_state": out.last_hidden_state}


class Seq2SeqDecoder(_Graph):
    """``input_ids (decoder), encoder_attention_mask, encoder_hidden_states -> logits,
    present.{i}.decoder/encoder.key/value`` (Optimum's decoder_model: the first step, no past in);
    ``masked=False``: no ``encoder_attention_mask`` (an encoder of features or pixels: Whisper, as Optimum)."""

    def __init__(self, model: nn.Module, masked: bool = True):
        super().__init__(model)
        self.masked, self.cache_config = masked, cache_config(model.config)
        mask = ("encoder_attention_mask",) if masked else ()
        self.graph_input_names = ("input_ids", *mask, "encoder_hidden_states")
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size", 1: "decoder_sequence_length"},
                                   **{n: {0: "batch_size", 1: "encoder_sequence_length"} for n in mask},
                                   "encoder_hidden_states": {0: "batch_size", 1: "encoder_sequence_length"}}

    graph_exporter_order = TRACE_FIRST

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """``logits`` and the self-attention cache along the decoder's tokens, the cross-attention cache along the
        encoder's."""
        layers = num_layers(self.model.config)
        own, cross = kv_names(layers, "present", ("decoder",)), kv_names(layers, "present", ("encoder",))
        encoder = self.graph_dynamic_axes["encoder_hidden_states"].get(1)
        return {"logits": {0: "batch_size", 1: "decoder_sequence_length"},
                **{n: {0: "batch_size", 2: "decoder_sequence_length"} for n in own},
                **{n: {0: "batch_size", **({2: encoder} if encoder else {})} for n in cross}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cache = _seq2seq_cache([], [], self.cache_config)
        mask = {"attention_mask": feed["encoder_attention_mask"]} if self.masked else {}
        out = self.model(encoder_outputs=_encoded(feed["encoder_hidden_states"]), decoder_input_ids=feed["input_ids"],
                         past_key_values=cache, use_cache=True, **mask)
        return {"logits": out.logits, **_seq2seq_present(_cache_of(out))}


def _encoded(hidden: torch.Tensor) -> Any:
    """The encoder's output as transformers' own output class: some seq2seq models (SwitchTransformers, ProphetNet)
    read ``encoder_outputs.last_hidden_state`` without wrapping a plain tuple as BART and T5 do."""
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=hidden)


def _seq2seq_present(cache: Any, encoder: bool = True) -> dict[str, torch.Tensor]:
    self_layers, cross_layers = _layers(cache.self_attention_cache), _layers(cache.cross_attention_cache)
    out = {}
    for i, (k, v) in enumerate(self_layers):
        out[f"present.{i}.decoder.key"], out[f"present.{i}.decoder.value"] = k, v
        if encoder:
            out[f"present.{i}.encoder.key"], out[f"present.{i}.encoder.value"] = cross_layers[i]
    return out


class Seq2SeqDecoderWithPast(_Graph):
    """``input_ids (the new tokens), encoder_attention_mask, past_key_values.{i}.decoder/encoder.* -> logits,
    present.{i}.decoder.*`` (Optimum's decoder_with_past_model: the cross-attention keys/values come from the
    first decoder step, so the encoder's hidden states are not an input); ``masked=False``: no mask (Whisper);
    ``tokens``: how many new tokens it takes (one by default)."""

    def __init__(self, model: nn.Module, masked: bool = True, tokens: int = 1):
        super().__init__(model)
        self.masked, self.cache_config, self.tokens = masked, cache_config(model.config), tokens
        self.take_tokens(tokens)
        layers = num_layers(model.config)
        self.past = kv_names(layers, "past_key_values", ("decoder", "encoder"))
        mask = ("encoder_attention_mask",) if masked else ()
        self.graph_input_names = ("input_ids", *mask, *self.past)
        self.graph_dynamic_axes = {"input_ids": {0: "batch_size"},
                                   **{n: {0: "batch_size", 1: "encoder_sequence_length"} for n in mask},
                                   **{n: {0: "batch_size", 2: "past_decoder_sequence_length" if ".decoder." in n
                                          else "encoder_sequence_length"} for n in self.past}}

    graph_exporter_order = TRACE_FIRST

    def graph_output_axes(self) -> dict[str, dict[int, str]]:
        """``logits`` per row, the self-attention cache ``tokens`` longer than the past."""
        own = [n.replace("past_key_values.", "present.", 1) for n in self.past if ".decoder." in n]
        total = f"past_decoder_sequence_length + {self.tokens}"
        return {"logits": {0: "batch_size"}, **{n: {0: "batch_size", 2: total} for n in own}}

    def compute(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        own = [feed[n] for n in self.past if ".decoder." in n]
        cross = [feed[n] for n in self.past if ".encoder." in n]
        cache = _seq2seq_cache(own, cross, self.cache_config)
        mask = {"attention_mask": feed["encoder_attention_mask"]} if self.masked else {}
        # the hidden states are read only for their shape once the cross-attention cache is filled
        width = encoder_width(self.model.config)
        hidden = cross[0].new_zeros((cross[0].shape[0], cross[0].shape[2], width))
        out = self.model(encoder_outputs=_encoded(hidden), decoder_input_ids=feed["input_ids"], past_key_values=cache,
                         use_cache=True, **mask)
        return {"logits": out.logits, **_seq2seq_present(_cache_of(out), encoder=False)}
