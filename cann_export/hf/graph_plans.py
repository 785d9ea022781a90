"""The transformers planner (a ``plan.Plan`` for the bundle writer, bundle/multi_write.py): which graphs a model
deploys as, with their example inputs and how they connect: a decoder with past (``prefill`` + ``decode``, or the
fixed-length ``prefill`` + ``decode`` of ``kv_cache="static:N"``) and an encoder-decoder (``encoder`` +
``decoder`` + ``decoder_with_past``). The example inputs of a later graph come from running the earlier ones
eagerly, so every graph is exported on the tensors it really receives."""
from __future__ import annotations

import re
from typing import Any

from ..plan import KINDS, Component, Plan
from ..errors import OptionsError

MAX_STATIC_LENGTH = 32768
MAX_STATIC_BATCH = 2048  # ATC's batch limit
MAX_DECODE_TOKENS = 4096  # the longest position table a decode graph's new tokens could fill (T5's relative ones)
DECODER_TASKS = ("text-generation-with-past",)
TEXT2TEXT_TASKS = ("text2text-generation-with-past", "text2text-generation")
SEQ2SEQ_TASKS = (*TEXT2TEXT_TASKS, "automatic-speech-recognition-with-past", "automatic-speech-recognition",
                 "image-to-text-with-past", "image-to-text")


def parse_kv_cache(value: Any) -> int | None:
    """``None`` / ``"dynamic"``: a growing cache (None); ``"static:N"`` (``"static:N,batch=B"``) or an int N: a
    fixed window of N slots (the batch: ``static_batch``)."""
    return None if value is None or value == "dynamic" else _static(value)[0]


def static_batch(value: Any) -> int:
    """The fixed batch of a ``"static:N,batch=B"`` cache (1 when not given)."""
    return 1 if value is None or value == "dynamic" else _static(value)[1]


def _static(value: Any) -> tuple[int, int]:
    text = str(value)
    m = re.fullmatch(r"(?:static:)?(\d{1,6})(?:,batch=(\d{1,5}))?", text.replace(" ", "")) \
        if not isinstance(value, bool) else None
    length, batch = (int(m.group(1)), int(m.group(2) or 1)) if m else (0, 0)
    if not m or not 2 <= length <= MAX_STATIC_LENGTH or not 1 <= batch <= MAX_STATIC_BATCH:
        raise OptionsError(f"--kv-cache {text!r} is not 'dynamic' or 'static:N[,batch=B]' with N in "
                           f"2..{MAX_STATIC_LENGTH} (the fixed number of cache slots) and B in 1..{MAX_STATIC_BATCH} "
                           "(the fixed batch, default 1), e.g. static:256 or static:256,batch=4")
    return length, batch


def check_decode_tokens(value: Any, kv_cache: Any = None) -> int:
    """``--decode-tokens N``: the new tokens the decode graph takes, a whole number in 1..MAX_DECODE_TOKENS; more
    than one only on a growing cache (a static window shifts by one token per step). ``kv_cache`` is checked too."""
    static = parse_kv_cache(kv_cache)
    if type(value) is not int or not 1 <= value <= MAX_DECODE_TOKENS:
        raise OptionsError(f"--decode-tokens (decode_tokens) {value!r} is not a whole number in 1..{MAX_DECODE_TOKENS}"
                           " (the new tokens the decode graph takes per step; 1 is the default)")
    if value != 1 and static is not None:
        raise OptionsError(f"--decode-tokens {value} with --kv-cache {kv_cache}: the static cache's decode graph takes "
                           "one token per step (its window shifts by one); drop one of them")
    return value


def plan_for(model: Any, task: str | None = None, kv_cache: Any = None, sequence_length: int = 7,
             check_only: bool = False, decode_tokens: int = 1) -> Plan | None:
    """The plan for a transformers model: a decoder-only model (``is_encoder_decoder`` false, with an LM head)
    or an encoder-decoder; ``task`` (Optimum's name) must agree when given; ``decode_tokens``: the new tokens its
    decode graph takes. ``check_only``: only check the options (no model yet)."""
    check_decode_tokens(decode_tokens, kv_cache)
    if check_only:
        parse_kv_cache(kv_cache)
        if task is not None and task not in (*DECODER_TASKS, *SEQ2SEQ_TASKS):
            raise OptionsError(f"task {task!r} does not export as several graphs; use "
                               f"{' or '.join((*DECODER_TASKS, *SEQ2SEQ_TASKS))}")
        return None
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise OptionsError("multi-graph export takes a transformers model (with a .config); got "
                           f"{type(model).__name__}")
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    wanted = seq2seq_tasks(model) if seq2seq else DECODER_TASKS
    if task is not None and task not in wanted:
        raise OptionsError(f"task {task!r} does not export as several graphs for a {config.model_type} model; "
                           f"use {' or '.join(wanted)}")
    if not 1 <= sequence_length <= 4096:
        raise OptionsError("sequence_length must be in 1..4096")
    length = parse_kv_cache(kv_cache)
    if seq2seq:
        if length is not None:
            raise OptionsError("--kv-cache static:N is for decoder-only models; an encoder-decoder exports "
                               "encoder, decoder and decoder_with_past")
        with_past = task is None or task.endswith("-with-past")
        if not with_past and decode_tokens != 1:
            raise OptionsError(f"--decode-tokens {decode_tokens} sizes the decoder_with_past graph, which task {task} "
                               f"does not export; drop it or use {task}-with-past")
        return seq2seq_plan(model, sequence_length, with_past=with_past, tokens=decode_tokens)
    return decoder_plan(model, sequence_length, decode_tokens) if length is None else \
        static_decoder_plan(model, length, static_batch(kv_cache))


def seq2seq_tasks(model: Any) -> tuple[str, ...]:
    """The multi-graph tasks of an encoder-decoder, as transformers' auto tables list its class (Whisper:
    automatic-speech-recognition(-with-past)); text2text-generation(-with-past) for a class they do not list."""
    from ..hf.tasks import tasks_of

    names = tuple(t.name for t in tasks_of(type(model).__name__) if t.name in SEQ2SEQ_TASKS)
    return names or TEXT2TEXT_TASKS


def encoder_inputs(model: Any, source: int) -> tuple[dict[str, Any], dict[str, dict[int, str]]]:
    """The encoder graph's example inputs and dynamic axes, asked of the model: its ``main_input_name``
    (``input_ids`` with the ``attention_mask`` text takes, ``input_features``, ``pixel_values``), shaped from the
    encoder's config as the single-graph export's dummy inputs are (``hf.inputs``: Whisper's ``num_mel_bins`` x
    ``2 * max_source_positions``), with Optimum's axis names (a text sequence: ``encoder_sequence_length``)."""
    import torch

    from .dummy_inputs import AXES, DEFAULT_DYNAMIC, dummy_specs, tensors
    from ..hf.tasks import SEQ

    main = getattr(model, "main_input_name", None) or "input_ids"
    if main not in AXES:
        raise OptionsError(f"the encoder of {type(model).__name__} takes {main!r}, which a multi-graph export does "
                           f"not know how to feed (it takes {', '.join(sorted(AXES))})")
    if main == "input_ids":
        ids = _ids(model.config, (EXAMPLE_BATCH, source), 0)
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    else:
        encoder_config = getattr(model.get_encoder(), "config", None) or model.config
        feed = tensors([spec.to_dict() for spec in dummy_specs([main], encoder_config, "feature-extraction")], 0)
    axes = {n: {a: "encoder_sequence_length" if AXES[n][a] == SEQ else AXES[n][a] for a in DEFAULT_DYNAMIC[n]}
            for n in feed}
    return feed, axes


def _vocab(config: Any) -> int:
    from .cache_wrappers import decoder_config

    vocab = getattr(decoder_config(config), "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 2 else 2


def _ids(config: Any, shape: tuple[int, ...], seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, _vocab(config), shape, generator=gen)


def _past(present: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("present.", "past_key_values.", 1): v for k, v in present.items() if k.startswith("present.")}


def _loop(component: str, names: list[str]) -> list[tuple[str, str, str, str]]:
    return [(component, n, component, n.replace("present.", "past_key_values.", 1)) for n in names]


def wiring(kind: str, outputs: list[str]) -> list[tuple[str, str, str, str]]:
    """The connections of a ``kind`` bundle from the output names of its first cache-producing graph (prefill,
    or the seq2seq decoder): export writes them and validate re-derives them with this one rule."""
    present = [n for n in outputs if n.startswith("present.")]
    if kind in ("decoder-with-past", "decoder-with-static-cache"):
        return [("prefill", n, "decode", n.replace("present.", "past_key_values.", 1)) for n in present] \
            + _loop("decode", present)
    connections = [("encoder", "last_hidden_state", "decoder", "encoder_hidden_states")]
    if kind == "encoder-decoder":  # Optimum's text2text-generation: the decoder re-reads the whole prefix
        return connections
    return connections + [("decoder", n, "decoder_with_past", n.replace("present.", "past_key_values.", 1))
                          for n in present] + _loop("decoder_with_past", [n for n in present if ".decoder." in n])


def wiring_source(kind: str) -> str:
    """The graph whose outputs ``wiring`` takes: prefill (a decoder), else the seq2seq decoder."""
    return "prefill" if "prefill" in KINDS[kind] else "decoder"


def run_notes(kind: str, cache_length: int | None = None, batch: int = 1, decode_tokens: int = 1) -> dict[str, Any]:
    """The ``run`` notes of a ``kind`` bundle (``cache_length``: the static cache's slots, ``batch``: its fixed
    batch, recorded when more than 1; ``decode_tokens``: the new tokens the loop graph takes, when more than 1)."""
    if kind == "decoder-with-static-cache":
        rows = {"batch": batch} if batch != 1 else {}
        return {"loop": "decode", "logits": "logits", "cache": f"static:{cache_length}"
                + (f",batch={batch}" if rows else ""), "cache_length": cache_length, **rows,
                "padding": "left", "mask": "attention_mask covers the cache slots and the new token (length + 1)"}
    loop = {"decoder-with-past": "decode", "encoder-decoder": "decoder"}.get(kind, "decoder_with_past")
    tokens = {"decode_tokens": decode_tokens} if decode_tokens != 1 else {}
    return {"loop": loop, "logits": "logits", "cache": "none" if kind == "encoder-decoder" else "dynamic", **tokens}


def _too_long(step: Any, prompt: int, tokens: int, what: str) -> None:
    """Refuse a decode graph of ``tokens`` new tokens that cannot follow the ``prompt`` the graphs are captured at
    within the model's positions (``what``: the table or window that bounds them)."""
    past = step.dim_bounds.get("past_sequence_length", (1, 0))[1]
    if tokens != 1 and past < prompt:
        raise OptionsError(f"--decode-tokens {tokens}: the model's {what} is too short for {tokens} new tokens after "
                           f"the {prompt}-token prompt the graphs are captured at; give --decode-tokens <= "
                           f"{max(1, past + tokens - prompt)}")


# the example batch of the graphs with dynamic axes: 2, so torch.export does not specialize the batch to 1
EXAMPLE_BATCH = 2


def decoder_plan(model: Any, prompt: int = 7, tokens: int = 1) -> Plan:
    """``prefill`` (the prompt) then ``decode`` (``tokens`` new tokens, one by default, on a growing cache); batch
    and lengths dynamic."""
    import torch

    from .cache_wrappers import DecoderPrefill, DecoderStep, sliding_window

    model = model.eval()
    prefill, step = DecoderPrefill(model), DecoderStep(model, tokens)
    if step.dim_bounds["past_sequence_length"][1] < prompt:
        window = sliding_window(model.config)
        what = (f"sliding window ({window} tokens: its cache keeps only the last window - 1)" if window else
                f"position table ({step.dim_bounds['sequence_length'][1]} tokens)")
        _too_long(step, prompt, tokens, what)
        raise OptionsError(f"the model's {what} is too short for the {prompt}-token prompt its graphs are captured "
                           "at; export one graph with --task text-generation (no cache)")
    batch = EXAMPLE_BATCH
    ids = _ids(model.config, (batch, prompt), 0)
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(prompt)[None].repeat(batch, 1)}
    present = {k: v for k, v in _run_prompt(prefill, feed).items() if k != "logits"}
    nxt = {"input_ids": _ids(model.config, (batch, tokens), 1),
           "attention_mask": torch.ones(batch, prompt + tokens, dtype=torch.long),
           "position_ids": torch.arange(prompt, prompt + tokens)[None].repeat(batch, 1), **_past(present)}
    kind = "decoder-with-past"
    return Plan(kind, [Component("prefill", "prefill", prefill, feed), Component("decode", "decode", step, nxt)],
                wiring(kind, list(present)), run_notes(kind, decode_tokens=tokens))


def _run_prompt(graph: Any, feed: dict[str, Any], part: str = "decoder") -> dict[str, Any]:
    """A graph's outputs on the plan's example inputs; the model's own failure there is the user's model's, named
    (a model whose inputs the task's dummies do not fit: Speech2Text's frames-first features)."""
    import torch

    from .. import errors

    try:
        with torch.no_grad():
            return graph(**feed)
    except errors.ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's model's forward
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in feed.items() if hasattr(t, "shape"))
        raise errors.PrepareError(f"the model's {part} failed on the task's example inputs ({shapes}): "
                                  f"{type(e).__name__}: {errors.gist(e)}. The architecture may take other inputs "
                                  "than the task's dummies; export one graph (--task feature-extraction or a "
                                  "single-graph task) or from Python with your own inputs") from e


def static_decoder_plan(model: Any, length: int, batch: int = 1) -> Plan:
    """Every shape fixed for ATC's static path: ``prefill`` takes ``batch`` left-padded prompts of exactly
    ``length`` tokens (the example's rows of different lengths); ``decode`` takes a window of ``length`` cache
    slots per row and returns it shifted by the new token."""
    import torch

    from .cache_wrappers import StaticDecoderStep, StaticPrefill

    _check_static_size(model.config, length, batch, sum(p.numel() for p in model.parameters()))
    model = model.eval()
    prefill, step = StaticPrefill(model), StaticDecoderStep(model)
    prompts = [max(1, length // 2 - row % max(1, length // 2)) for row in range(batch)]
    mask = torch.stack([torch.cat([torch.zeros(length - n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
                        for n in prompts])
    feed = {"input_ids": _ids(model.config, (batch, length), 0), "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    with torch.no_grad():
        present = {k: v for k, v in prefill(**feed).items() if k != "logits"}
    nxt = {"input_ids": _ids(model.config, (batch, 1), 1),
           "attention_mask": torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1),
           "position_ids": torch.tensor(prompts)[:, None], **_past(present)}
    kind = "decoder-with-static-cache"
    return Plan(kind, [Component("prefill", "prefill", prefill, feed), Component("decode", "decode", step, nxt)],
                wiring(kind, list(present)), run_notes(kind, length, batch))


MAX_STATIC_VALUES = 1 << 28  # a static cache's values at the example (1 GiB in fp32), or the weights' if more


def _check_static_size(config: Any, length: int, batch: int, weights: int = 0) -> None:
    """``--kv-cache static:N,batch=B`` within the model: N slots within its position table, and a cache the
    example can hold (the graphs are captured and judged at that size): at most 1 GiB or the weights' own size
    (Llama-2-7B's native static:4096 is 2.1e9 values beside 6.7e9 weights)."""
    from .cache_wrappers import max_positions, sliding_window

    limit, window = max_positions(config), sliding_window(config)
    if window is not None and length > window - 1:
        raise OptionsError(f"--kv-cache static:{length}: the model's sliding window ({window} tokens) keeps only the "
                           f"last {window - 1} in its cache; give static:N with N <= {window - 1}")
    if length > limit:
        raise OptionsError(f"--kv-cache static:{length}: the model's position table holds {limit} positions, so at "
                           f"most {limit} cache slots; give static:N with N <= {limit}")
    heads = getattr(config, "num_attention_heads", None)
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if not all(isinstance(v, int) and v > 0 for v in (heads, hidden, layers)):
        return
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    values, cap = batch * layers * 2 * kv_heads * length * head_dim, max(MAX_STATIC_VALUES, weights)
    if values > cap:
        raise OptionsError(f"--kv-cache static:{length},batch={batch}: the cache holds {values:,} values "
                           f"({values * 4 / 2**30:.1f} GiB in fp32) at the example the graphs are captured and judged "
                           f"at, more than the model's weights or 1 GiB; give fewer slots or a smaller batch")


def seq2seq_plan(model: Any, source: int = 7, with_past: bool = True, tokens: int = 1) -> Plan:
    """``encoder`` (its inputs: ``encoder_inputs``), ``decoder`` (the first decoder step, which also yields the
    cross-attention cache) and ``decoder_with_past`` (``tokens`` new tokens, one by default, on the cache); the
    decoders take an
    ``encoder_attention_mask`` only where the encoder takes a mask (text)."""
    import torch

    from .cache_wrappers import Seq2SeqDecoder, Seq2SeqDecoderWithPast, Seq2SeqEncoder

    model = model.eval()
    enc_feed, enc_axes = encoder_inputs(model, source)
    masked = "attention_mask" in enc_feed
    encoder = Seq2SeqEncoder(model, enc_axes)
    decoder, stepper = Seq2SeqDecoder(model, masked), Seq2SeqDecoderWithPast(model, masked, tokens)
    batch = EXAMPLE_BATCH
    mask = {"encoder_attention_mask": enc_feed["attention_mask"]} if masked else {}
    start = getattr(model.config, "decoder_start_token_id", None)
    # the start token and one more: a decoder prompt of 2 (Whisper's forced task tokens make it longer), so
    # torch.export does not specialize decoder_sequence_length to the size 1
    first = torch.cat([torch.full((batch, 1), start if isinstance(start, int) and start >= 0 else 0),
                       _ids(model.config, (batch, 1), 2)], 1)
    hidden = _run_prompt(encoder, enc_feed, "encoder")["last_hidden_state"]
    dec_feed = {"input_ids": first, **mask, "encoder_hidden_states": hidden}
    present = {k: v for k, v in _run_prompt(decoder, dec_feed, "decoder").items() if k != "logits"}
    if not any("encoder_sequence_length" in axes.values() for axes in enc_axes.values()):
        for graph in (decoder, stepper):  # a pixel / feature encoder of one input size: one output length
            graph.dim_bounds["encoder_sequence_length"] = (1, int(hidden.shape[1]))
    if tokens != 1 and stepper.dim_bounds["past_decoder_sequence_length"][1] < first.shape[1]:
        raise OptionsError(f"--decode-tokens {tokens}: the decoder's position table is too short for {tokens} new "
                           f"tokens after the {first.shape[1]}-token decoder prompt the graphs are captured at")
    past_feed = {"input_ids": _ids(model.config, (batch, tokens), 1), **mask, **_past(present)}
    kind = "encoder-decoder-with-past" if with_past else "encoder-decoder"
    parts = [Component("encoder", "encoder", encoder, enc_feed), Component("decoder", "decoder", decoder, dec_feed)]
    if with_past:
        parts.append(Component("decoder_with_past", "decoder_with_past", stepper, past_feed))
    return Plan(kind, parts, wiring(kind, list(present)), run_notes(kind, decode_tokens=tokens if with_past else 1))
