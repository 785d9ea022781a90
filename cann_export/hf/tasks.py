"""Optimum's task names, detected from config.json's ``architectures`` through transformers' own auto-model
tables (``MODEL_FOR_*_MAPPING_NAMES``), never the hub; each task with Optimum's input, output and axis names
(optimum/exporters/onnx/base.py ``_TASK_TO_COMMON_OUTPUTS`` and model_configs.py).

The table is shared: ``TASKS[name]`` says which auto class loads a task, what it outputs and whether it is one
graph (``graphs == 1``, exported here) or several (decoders with past, encoder-decoders: the multi-graph
bundle's components read the same table)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LoadError

BATCH, SEQ = "batch_size", "sequence_length"


@dataclass(frozen=True)
class Task:
    name: str
    mapping: str | None  # transformers' MODEL_FOR_*_MAPPING_NAMES whose classes do this task (None: any model)
    auto_class: str  # the transformers Auto class that loads it when the directory's class does another task
    outputs: tuple[tuple[str, dict[int, str]], ...]  # Optimum's output names and their dynamic axes
    graphs: int = 1  # 1: a single graph; 2+: prefill/decode or encoder/decoder graphs (multi-graph bundles)


def _t(name: str, mapping: str | None, auto: str, outputs: dict[str, dict[int, str]], graphs: int = 1) -> Task:
    return Task(name, mapping, auto, tuple(outputs.items()), graphs)


# In detection order: the first task whose mapping holds the directory's class is the default.
TASKS: dict[str, Task] = {t.name: t for t in (
    _t("question-answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering",
       {"start_logits": {0: BATCH, 1: SEQ}, "end_logits": {0: BATCH, 1: SEQ}}),
    _t("token-classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification",
       {"logits": {0: BATCH, 1: SEQ}}),
    _t("text-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
       "AutoModelForSequenceClassification", {"logits": {0: BATCH}}),
    # before fill-mask: transformers' masked-LM table also lists BART-style seq2seq classes (their denoising
    # objective), which are generation models
    _t("text2text-generation", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM",
       {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=2),
    _t("text2text-generation-with-past", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM",
       {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=3),
    _t("fill-mask", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", {"logits": {0: BATCH, 1: SEQ}}),
    _t("text-generation", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM",
       {"logits": {0: BATCH, 1: SEQ}}),
    _t("text-generation-with-past", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM",
       {"logits": {0: BATCH, 1: SEQ}}, graphs=2),
    _t("automatic-speech-recognition", "MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC",
       {"logits": {0: BATCH, 1: SEQ}}),
    _t("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification",
       {"logits": {0: BATCH}}),
    _t("image-segmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "AutoModelForSemanticSegmentation",
       {"logits": {0: BATCH}}),  # Optimum's name for Segformer / DPT-style per-pixel class logits
    _t("object-detection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "AutoModelForObjectDetection",
       {"logits": {0: BATCH, 1: "num_queries"}, "pred_boxes": {0: BATCH, 1: "num_queries"}}),
    _t("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification",
       {"logits": {0: BATCH}}),
    _t("zero-shot-image-classification", "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
       "AutoModelForZeroShotImageClassification",
       {"logits_per_image": {0: "image_batch_size", 1: "text_batch_size"},
        "logits_per_text": {0: "text_batch_size", 1: "image_batch_size"},
        "text_embeds": {0: "text_batch_size"}, "image_embeds": {0: "image_batch_size"}}),
    _t("feature-extraction", None, "AutoModel", {"last_hidden_state": {0: BATCH, 1: SEQ}}),
)}
# Speech encoder-decoders (Whisper) do automatic-speech-recognition as several graphs; CTC models as one.
SEQ2SEQ_SPEECH = "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"
ASR_SEQ2SEQ = (_t("automatic-speech-recognition", SEQ2SEQ_SPEECH, "AutoModelForSpeechSeq2Seq",
                  {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=2),
               _t("automatic-speech-recognition-with-past", SEQ2SEQ_SPEECH, "AutoModelForSpeechSeq2Seq",
                  {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=3))
# Vision encoder-decoders (TrOCR, Donut: VisionEncoderDecoderModel) do image-to-text as encoder + decoder graphs
# (Optimum's task names); the other classes of transformers' image-text-to-text table are decoder-only multimodal
# models, which these graphs do not fit.
VISION_SEQ2SEQ = ("VisionEncoderDecoderModel",)
IMAGE2TEXT = (_t("image-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText",
                 {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=2),
              _t("image-to-text-with-past", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText",
                 {"logits": {0: BATCH, 1: "decoder_sequence_length"}}, graphs=3))
# Classes in no auto table that Optimum still exports (their own OnnxConfigs): feature-extraction, own outputs.
EXTRA_FEATURE_CLASSES = {
    "CLIPTextModelWithProjection": {"text_embeds": {0: BATCH}, "last_hidden_state": {0: BATCH, 1: SEQ}},
    "CLIPVisionModelWithProjection": {"image_embeds": {0: BATCH}, "last_hidden_state": {0: BATCH, 1: SEQ}},
}
# model types whose feature-extraction also outputs pooler_output in Optimum (CLIPTextOnnxConfig, ViT-based)
POOLER_TYPES = ("clip_text_model", "clip_vision_model", "siglip_text_model", "siglip_vision_model")
ALL_TASK_NAMES = tuple(dict.fromkeys([*TASKS, *(t.name for t in (*ASR_SEQ2SEQ, *IMAGE2TEXT))]))


def _mapping(name: str) -> dict[str, Any]:
    from ..load.torchvision_pair import hide_broken_torchvision

    hide_broken_torchvision()  # before transformers' first import reads whether torchvision is there
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name, {})


def _classes(mapping: str) -> set[str]:
    out: set[str] = set()
    for value in _mapping(mapping).values():
        out.update(value if isinstance(value, (tuple, list)) else (value,))
    return out


def known_class(arch: str) -> bool:
    """``arch`` names a class of transformers' own auto tables (so importing it from transformers is safe)."""
    from ..load.torchvision_pair import hide_broken_torchvision

    hide_broken_torchvision()
    from transformers.models.auto import modeling_auto

    return arch in EXTRA_FEATURE_CLASSES or any(
        arch in _classes(name) for name in dir(modeling_auto) if name.endswith("_MAPPING_NAMES")
        and name != "CONFIG_MAPPING_NAMES")


def tasks_of(arch: str) -> list[Task]:
    """The tasks ``arch`` does, default first (feature-extraction always: the base model, or the encoder of an
    encoder-decoder)."""
    found = [t for t in TASKS.values() if t.mapping is not None and arch in _classes(t.mapping)]
    if arch in _classes(SEQ2SEQ_SPEECH):
        found = [*ASR_SEQ2SEQ, *found]
    if arch in VISION_SEQ2SEQ:
        found = [*IMAGE2TEXT, *found]
    if arch in EXTRA_FEATURE_CLASSES or known_class(arch):
        found.append(TASKS["feature-extraction"])
    return found


def detect(config: dict[str, Any], requested: str | None, path: Any = None,
           with_past: bool = True) -> tuple[str, Task]:
    """(the architecture, its task): ``requested`` (--task) when the architecture does it, else its default:
    as in Optimum's main_export, the ``-with-past`` form of the first task when the architecture has one and
    config.json's ``use_cache`` is not false (``with_past=False``: the first task as it is)."""
    archs = config.get("architectures") or []
    if not archs:
        raise LoadError("config.json names no architectures, so the task cannot be told; re-save the model with "
                        "save_pretrained (which records the class), or add e.g. \"architectures\": "
                        "[\"BertForSequenceClassification\"]", path=path)
    if requested is not None and requested not in ALL_TASK_NAMES:
        raise LoadError(f"--task {requested!r} is not a task name; use one of {', '.join(ALL_TASK_NAMES)}", path=path)
    arch = archs[0]
    found = tasks_of(arch)
    if not found:
        raise LoadError(f"config.json's architecture {arch!r} is not a transformers class with an export task (none "
                        "of transformers' auto-model tables lists it); a custom class needs --trust-remote-code and "
                        "--task, or export it from Python with cann_export.export(model, ...)", path=path)
    if requested is None:
        return arch, default_task(found, config) if with_past else found[0]
    for task in found:
        if task.name == requested:
            return arch, task
    names = ", ".join(dict.fromkeys(t.name for t in found))
    raise LoadError(f"--task {requested} is not a task of {arch} (config.json's architectures); it does: {names}. "
                    "Pass one of those, or a directory saved from a class with that head", path=path)


def default_task(found: list[Task], config: dict[str, Any]) -> Task:
    """The first of ``found``, or its ``-with-past`` form (a decoder's prefill + decode, an encoder-decoder's
    decoder_with_past) when the architecture has it and the model keeps a cache (``use_cache``, true unless the
    config says false: transformers' default for every class with a cache)."""
    past = next((t for t in found if t.name == f"{found[0].name}-with-past"), None)
    return past if past is not None and config.get("use_cache", True) is not False else found[0]


def graphs_of(name: str | None) -> int:
    """How many graphs the task ``name`` exports as at most (1 for a single-graph task or an unknown name)."""
    return max((t.graphs for t in (*TASKS.values(), *ASR_SEQ2SEQ, *IMAGE2TEXT) if t.name == name), default=1)


def two_tower(arch: str) -> bool:
    """A text-image model of the zero-shot table (CLIP, SigLIP, ...): its base model is the two towers, which
    return scores and embeddings, no ``last_hidden_state``; its feature-extraction exports those (as Optimum)."""
    return arch in _classes(TASKS["zero-shot-image-classification"].mapping or "")


def outputs_of(task: Task, arch: str, model_type: str) -> dict[str, dict[int, str]]:
    """Optimum's output names and axes for ``task`` on ``arch``."""
    if task.name == "feature-extraction" and arch in EXTRA_FEATURE_CLASSES:
        return dict(EXTRA_FEATURE_CLASSES[arch])
    if task.name == "feature-extraction" and two_tower(arch):  # Optimum's CLIPOnnxConfig: one set of outputs
        return dict(TASKS["zero-shot-image-classification"].outputs)
    outputs = dict(task.outputs)
    if task.name == "feature-extraction" and model_type in POOLER_TYPES:
        outputs["pooler_output"] = {0: BATCH}
    return outputs
