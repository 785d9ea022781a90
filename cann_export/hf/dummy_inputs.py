"""Dummy inputs of a task from the model's config, named, typed and shaped as Optimum's dummy input generators
make them (int64 ids, masks and LayoutLM's word boxes, batch 2, sequence 16 bounded by the position table;
pixel_values from image_size / num_channels; input_features from num_mel_bins and the encoder's positions;
input_values from the sampling rate), with Optimum's axis names for each (``dynamic_axes``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .tasks import BATCH, SEQ

DUMMY_BATCH, DUMMY_SEQ = 2, 16
MAX_DUMMY_ELEMENTS = 1 << 28  # per dummy input (1 GiB of float32): config fields each in range can multiply past it
# a dynamic sequence axis is checked up to 4x the example's length by default: the example stays a quarter of
# the longest sequence the position table takes, so every checked length is one the model computes
SEQ_HEADROOM = 4
AXES = {
    "input_ids": {0: BATCH, 1: SEQ}, "attention_mask": {0: BATCH, 1: SEQ}, "token_type_ids": {0: BATCH, 1: SEQ},
    "position_ids": {0: BATCH, 1: SEQ}, "bbox": {0: BATCH, 1: SEQ},
    "pixel_values": {0: BATCH, 1: "num_channels", 2: "height", 3: "width"},
    "input_features": {0: BATCH, 1: "feature_size", 2: "encoder_sequence_length"},
    "input_values": {0: BATCH, 1: SEQ},
}
# The axes an export makes dynamic by default (``dynamic_axes``): those the model computes at any size (raw audio's
# length from the feature encoder's receptive field: ``dynamic_ranges``; an image's height and width where the
# architecture takes any: ``image_sides``). Optimum also names num_channels and Whisper's feature axes, but conv
# weights and Whisper's fixed 30 s window pin them: they stay named in ``AXES`` (extras["hf"]["axes"]) and static.
DEFAULT_DYNAMIC = {"input_ids": (0, 1), "attention_mask": (0, 1), "token_type_ids": (0, 1), "position_ids": (0, 1),
                   "bbox": (0, 1), "pixel_values": (0,), "input_features": (0,), "input_values": (0, 1)}


@dataclass(frozen=True)
class InputSpec:
    """One dummy input: ``kind`` "ids" (uniform in [0, high)), "mask" (ones), "zeros", "positions" (arange),
    "boxes" (valid boxes, coordinates in 0..high: ``inputs.boxes``) or "float" (standard normal)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    high: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "kind": self.kind, "high": self.high}


from ..inputs.eos_rows import DUMMY  # noqa: E402 - the source name the eos rule keys on
from ..inputs.boxes import box_high, random_boxes  # noqa: E402 - LayoutLM's word boxes
from .config_json import SUB_CONFIGS  # noqa: E402 - composite models (CLIP) keep their fields in sub-configs
from .image_sides import image_sides  # noqa: E402 - which architectures take any height and width


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _get(config: Any, name: str, default: Any = None) -> Any:
    """``config``'s field ``name``, else the first sub-config's that has it (``SUB_CONFIGS``), else ``default``."""
    value = _field(config, name)
    for sub in SUB_CONFIGS:
        inner = _field(config, sub)
        if value is None and inner is not None:
            value = _field(inner, name)
    return default if value is None else value


def _image_size(config: Any) -> tuple[int, int]:
    size = _get(config, "image_size", 224)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    return int(size), int(size)


def dummy_specs(params: list[str], config: Any, task: str, sampling_rate: int | None = None) -> list[InputSpec]:
    """The inputs a model whose forward takes ``params`` gets for ``task``, in forward's order."""
    seq = min(DUMMY_SEQ, max(1, max_sequence(config) // SEQ_HEADROOM))
    batch = DUMMY_BATCH
    specs: list[InputSpec] = []
    for name in params:
        if name == "input_ids":
            specs.append(InputSpec(name, (batch, seq), "ids", int(_get(config, "vocab_size", 2))))
        elif name == "attention_mask" and "input_ids" in params:  # audio models: input_values only (Optimum)
            specs.append(InputSpec(name, (batch, seq), "mask"))
        elif name == "token_type_ids" and int(_get(config, "type_vocab_size", 0)) > 1:
            specs.append(InputSpec(name, (batch, seq), "zeros"))
        elif name == "position_ids" and task.startswith("text-generation"):
            specs.append(InputSpec(name, (batch, seq), "positions"))
        elif name == "bbox":  # LayoutLM-style: a word box per token (Optimum's bbox)
            high = box_high(_get(config, "max_2d_position_embeddings"))
            specs.append(InputSpec(name, (batch, seq, 4), "boxes", high))
        elif name == "pixel_values":
            height, width = _image_size(config)
            specs.append(InputSpec(name, (batch, int(_get(config, "num_channels", 3)), height, width), "float"))
        elif name == "input_features":
            frames = 2 * int(_get(config, "max_source_positions", 1500))
            specs.append(InputSpec(name, (batch, int(_get(config, "num_mel_bins", 80)), frames), "float"))
        elif name == "input_values":
            specs.append(InputSpec(name, (batch, _audio_samples(sampling_rate)), "float"))
    for spec in specs:
        _check_elements(spec)
    return specs


FIELDS = {"pixel_values": "image_size and num_channels", "input_features": "num_mel_bins and max_source_positions",
          "input_values": "preprocessor_config.json's sampling_rate"}


def _check_elements(spec: InputSpec) -> None:
    from ..errors import LoadError

    count = 1
    for d in spec.shape:
        count *= d
    if count > MAX_DUMMY_ELEMENTS:
        fields = FIELDS.get(spec.name, "vocab_size and max_position_embeddings")
        raise LoadError(f"config.json's {fields} make the dummy {spec.name} {list(spec.shape)}, {count:,} elements, "
                        f"past the {MAX_DUMMY_ELEMENTS:,} any real model's input holds; refused before allocating it. "
                        "Fix the fields or re-save the model with save_pretrained", path="config.json")


def max_sequence(config: Any) -> int:
    """The longest sequence the model's position table takes: ``max_position_embeddings`` (``n_positions``) less
    two, the offset RoBERTa-style tables reserve for the padding index."""
    positions = _get(config, "max_position_embeddings") or _get(config, "n_positions") or 4 * DUMMY_SEQ + 2
    return max(1, int(positions) - 2)


def _pixel_sides(spec: InputSpec, config: Any) -> Any:
    """``image_sides`` of a ``pixel_values`` spec (its example side: the larger of height and width)."""
    return image_sides(config, max(spec.shape[2], spec.shape[3]))


def _dynamic_of(spec: InputSpec, config: Any) -> tuple[int, ...]:
    if spec.name == "pixel_values" and config is not None and _pixel_sides(spec, config).sides is not None:
        return (0, 2, 3)
    return DEFAULT_DYNAMIC[spec.name]


def dynamic_ranges(specs: list[InputSpec], config: Any) -> dict[str, dict[int, list[int | None]]]:
    """The sizes each default dynamic axis takes: ``{input: {axis: [min, max]}}``, ``None`` where the prepare
    stage decides (batch; a sequence up to the position table: inputs/dynamic_axes._complete)."""
    out: dict[str, dict[int, list[int | None]]] = {s.name: {a: [1, None] for a in _dynamic_of(s, config)}
                                                    for s in specs}
    for s in specs:  # raw audio: from the feature encoder's receptive field (at most the dummy's length) up
        if s.name == "input_values":
            out[s.name][1] = [receptive_field(config, s.shape[1]), None]
        sides = _pixel_sides(s, config).sides if s.name == "pixel_values" else None
        if sides is not None:
            out[s.name].update({2: list(sides), 3: list(sides)})
    return out


def static_axes(specs: list[InputSpec], config: Any) -> list[dict[str, Any]]:
    """The axes Optimum names dynamic that this export keeps fixed, and why (the manifest's ``model.static_axes``):
    an image's height and width where the architecture does not take any size."""
    out = []
    for s in specs:
        why = _pixel_sides(s, config).why if s.name == "pixel_values" else None
        if why is not None:
            out.append({"input": s.name, "axes": {"2": "height", "3": "width"},
                        "sizes": [s.shape[2], s.shape[3]], "why": why})
    return out


def receptive_field(config: Any, cap: int = 1 << 20) -> int:
    """The fewest raw-audio samples a conv feature encoder (Wav2Vec2-style ``conv_kernel`` / ``conv_stride``) turns
    into one frame, at most ``cap``: 400 at 16 kHz for Wav2Vec2's (10,3,3,3,3,2,2) / (5,2,2,2,2,2,2)."""
    kernels, strides = _get(config, "conv_kernel"), _get(config, "conv_stride")
    if not isinstance(kernels, (list, tuple)) or not isinstance(strides, (list, tuple)):
        return 1
    field, jump = 1, 1
    for k, s in zip(kernels, strides, strict=False):
        if type(k) is int and type(s) is int and k > 0 and s > 0:
            field, jump = field + (k - 1) * jump, jump * s
        if field >= cap:
            return cap
    return field


def _audio_samples(sampling_rate: int | None) -> int:
    """A tenth of a second of audio (1600 samples at 16 kHz)."""
    return max(400, int(sampling_rate or 16000) // 10)


def tensors(specs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The seeded tensors of ``specs`` (InputSpec dicts): ids and masks int64, features float32."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for spec in specs:
        shape, kind = tuple(spec["shape"]), spec["kind"]
        if kind == "ids":
            out[spec["name"]] = torch.randint(0, max(1, spec["high"]), shape, generator=gen, dtype=torch.int64)
        elif kind == "mask":
            out[spec["name"]] = torch.ones(shape, dtype=torch.int64)
        elif kind == "zeros":
            out[spec["name"]] = torch.zeros(shape, dtype=torch.int64)
        elif kind == "positions":
            out[spec["name"]] = torch.arange(shape[-1], dtype=torch.int64).expand(shape).contiguous()
        elif kind == "boxes":
            out[spec["name"]] = random_boxes(shape, spec["high"], gen)
        else:
            out[spec["name"]] = torch.randn(shape, generator=gen, dtype=torch.float32)
    return out


# A task whose inputs' batches are independent: CLIP / SigLIP's zero-shot scores any number of texts against any
# number of images (Optimum's CLIPOnnxConfig names them text_batch_size and image_batch_size, as its outputs are)
SEPARATE_BATCHES = {"zero-shot-image-classification": {"pixel_values": "image_batch_size"}}
TEXT_BATCH = "text_batch_size"


def _axes_of(name: str, task: str | None) -> dict[int, str]:
    """``task``: None for one shared batch (ATC < 8 renders every combination of gears as a profile: CLIP's
    separate batches and sequence make 175 at the default ranges, past ATC's 100)."""
    axes = dict(AXES[name])
    separate = SEPARATE_BATCHES.get(task or "")
    if separate is not None:
        axes[0] = separate.get(name, TEXT_BATCH)
    return axes


def dynamic_axes(specs: list[InputSpec], task: str | None = None, config: Any = None) -> dict[str, dict[int, str]]:
    """The inputs' default dynamic axes, by Optimum's names: ``{input: {axis: axis name}}`` (DEFAULT_DYNAMIC; an
    image's height and width too where ``config``'s architecture takes any size)."""
    return {s.name: {a: _axes_of(s.name, task)[a] for a in _dynamic_of(s, config)} for s in specs}


def all_axes(specs: list[InputSpec], outputs: dict[str, dict[int, str]],
             task: str | None = None) -> dict[str, dict[str, str]]:
    """Optimum's name of every axis it names, inputs and outputs (JSON keys: axes as strings)."""
    named = {**{s.name: _axes_of(s.name, task) for s in specs}, **outputs}
    return {name: {str(a): label for a, label in axes.items()} for name, axes in named.items()}


@dataclass(frozen=True)
class TaskDummyInputs:
    """The prepare stage's inputs for a Hugging Face model without other inputs: its task's dummy inputs."""

    name: str = "hf_task"
    priority: int = 45  # below what the caller gave, the archive's and a recorded call; above first-layer guessing

    def provide(self, ctx: Any) -> tuple[dict[str, Any], str] | None:
        hf = ctx.loaded.extras.get("hf") if ctx.loaded is not None else None
        if not isinstance(hf, dict) or "dummy_inputs" not in hf:
            return None
        return tensors(hf["dummy_inputs"], ctx.options.seed), f"the {hf['task']} task's {DUMMY}"
