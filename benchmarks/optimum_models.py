"""The models of bench_vs_optimum.py, from configs with random weights (nothing is downloaded), written with
``save_pretrained`` into ``OUT/NAME/``: about a dozen architectures covering each family a user exports (text
encoder, decoder with past, encoder-decoder, vision, audio, multimodal), small but shaped like the real ones.
With ``--pt2``, ``OUT/NAME.pt2`` is also a positional torch.export capture of a one-graph model at its
benchmark shapes (the .pt2 path, for a checkout whose ``cann-export DIR`` is not there yet).

Run as ``python optimum_models.py OUT NAME[,NAME...] [--pt2]``; prints one JSON line of facts per model."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

SEQ = 128
IMAGE = 224
AUDIO_SAMPLES = 16000  # one second at 16 kHz
MEL_FRAMES = 3000  # Whisper's real 30-second window (1500 encoder positions)


@dataclass(frozen=True)
class Spec:
    family: str
    task: str  # Optimum's task name, given to both tools
    about: str
    inputs: dict[str, tuple[int, ...]]  # the benchmark's input shapes (--shapes fixed, the .pt2 capture)


TEXT = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
PIXELS = {"pixel_values": (1, 3, IMAGE, IMAGE)}

MODELS: dict[str, Spec] = {
    "distilbert": Spec("text encoder", "text-classification", "DistilBERT, 4 layers, dim 256", TEXT),
    "bert": Spec("text encoder", "feature-extraction", "BERT, 4 layers, hidden 256", TEXT),
    "roberta": Spec("text encoder", "token-classification", "RoBERTa, 4 layers, hidden 256, 9 labels", TEXT),
    "gpt2": Spec("decoder with past", "text-generation-with-past", "GPT-2 small, 12 layers, dim 768", TEXT),
    "llama": Spec("decoder with past", "text-generation-with-past",
                  "Llama, 4 layers, hidden 512, 8 heads / 2 KV heads (GQA), vocab 32000", TEXT),
    "t5": Spec("encoder-decoder", "text2text-generation-with-past", "T5, 4+4 layers, d_model 256, vocab 32128", TEXT),
    "bart": Spec("encoder-decoder", "text2text-generation-with-past", "BART, 4+4 layers, d_model 256, vocab 50265",
                 TEXT),
    "vit": Spec("vision", "image-classification", "ViT-small/16, 12 layers, dim 384, 224x224", PIXELS),
    "resnet": Spec("vision", "image-classification", "ResNet-18 (basic blocks, 64..512 channels), 224x224", PIXELS),
    "convnext": Spec("vision", "image-classification", "ConvNeXt, depths 2-2-4-2, 64..512 channels, 224x224", PIXELS),
    "whisper": Spec("audio", "automatic-speech-recognition-with-past",
                    "Whisper-tiny-sized, 4+4 layers, d_model 384, 80 x 3000 frames (1500 positions)",
                    {"input_features": (1, 80, MEL_FRAMES)}),
    "wav2vec2": Spec("audio", "automatic-speech-recognition", "Wav2Vec2 CTC, 4 layers, hidden 256, 1 s of 16 kHz",
                     {"input_values": (1, AUDIO_SAMPLES)}),
    "clip": Spec("multimodal", "zero-shot-image-classification",
                 "CLIP, text 4 layers x 256, vision ViT-B/32-shaped 4 layers x 384, 224x224",
                 {"input_ids": (1, 77), "attention_mask": (1, 77), **PIXELS}),  # 77: its text positions
}
FLOAT_INPUTS = ("pixel_values", "input_values", "input_features")
# tasks that deploy as several graphs (no single positional .pt2)
MODEL_GRAPHS = {"text-generation-with-past": 2, "text2text-generation-with-past": 3,
                "automatic-speech-recognition-with-past": 3}


def _text_encoder(name: str):
    import transformers as tf

    small = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
    if name == "distilbert":
        return tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
            n_layers=4, dim=256, n_heads=4, hidden_dim=1024, vocab_size=30522, num_labels=2))
    if name == "bert":
        return tf.BertModel(tf.BertConfig(vocab_size=30522, **small))
    return tf.RobertaForTokenClassification(tf.RobertaConfig(vocab_size=50265, num_labels=9, **small))


def _generator(name: str):
    import transformers as tf

    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config())
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048))
    if name == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=256, d_ff=1024, d_kv=64, num_layers=4, num_decoder_layers=4, num_heads=4, vocab_size=32128))
    return tf.BartForConditionalGeneration(tf.BartConfig(
        d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=50265))


def _vision(name: str):
    import transformers as tf

    if name == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(
            hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536, image_size=IMAGE,
            patch_size=16, num_labels=1000))
    if name == "resnet":
        return tf.ResNetForImageClassification(tf.ResNetConfig(
            layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], num_labels=1000))
    return tf.ConvNextForImageClassification(tf.ConvNextConfig(
        depths=[2, 2, 4, 2], hidden_sizes=[64, 128, 256, 512], num_labels=1000, image_size=IMAGE))


def _audio_or_multimodal(name: str):
    import transformers as tf

    if name == "whisper":
        return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
            encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=MEL_FRAMES // 2,
            max_target_positions=448, vocab_size=51865))
    if name == "wav2vec2":
        return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=32))
    return tf.CLIPModel(tf.CLIPConfig(
        text_config={"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
                     "num_attention_heads": 4},
        vision_config={"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 4,
                       "num_attention_heads": 6, "image_size": IMAGE, "patch_size": 32},
        projection_dim=256))


BUILDERS = {"text encoder": _text_encoder, "decoder with past": _generator, "encoder-decoder": _generator,
            "vision": _vision, "audio": _audio_or_multimodal, "multimodal": _audio_or_multimodal}


def build(name: str):
    """The model ``name`` in eval mode, random weights (seeded)."""
    # this venv's torchvision wheel does not load against the CPU torch, and transformers imports it where it is
    # installed; none of these models needs it
    sys.modules.setdefault("torchvision", None)
    import torch

    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    torch.manual_seed(0)
    return BUILDERS[MODELS[name].family](name).eval()


def example_inputs(spec: Spec) -> tuple:
    import torch

    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(*dims, generator=g) if n in FLOAT_INPUTS else
                 torch.ones(*dims, dtype=torch.int64) if n == "attention_mask" else
                 torch.randint(0, 1000, dims, generator=g) for n, dims in spec.inputs.items())


def positional(model, names: list[str]):
    """``model`` behind positional inputs and a tuple of tensor outputs, as torch.export needs for a .pt2 that
    cann-export loads (its keyword-input .pt2 support is another branch's work)."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(names, args, strict=True)))
            return tuple(v for v in out.values() if isinstance(v, torch.Tensor))

    return Positional()


def save_pt2(model, spec: Spec, path: Path) -> bool:
    """A positional torch.export capture of a one-graph model (False: the task deploys as several graphs)."""
    import torch

    if MODEL_GRAPHS.get(spec.task, 1) > 1:
        return False
    with torch.no_grad():
        ep = torch.export.export(positional(model, list(spec.inputs)), example_inputs(spec))
    torch.export.save(ep, str(path))
    return True


def main() -> None:
    out, names, pt2 = Path(sys.argv[1]), sys.argv[2].split(","), "--pt2" in sys.argv[3:]
    for name in names:
        model = build(name)
        spec = MODELS[name]
        model.save_pretrained(out / name)
        if pt2:
            save_pt2(model, spec, out / f"{name}.pt2")
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"name": name, "family": spec.family, "task": spec.task, "about": spec.about,
                          "weights_bytes": weights, "inputs": {n: list(d) for n, d in spec.inputs.items()}}))


if __name__ == "__main__":
    main()
