"""The pipelines of bench_pipeline_vs_optimum.py, random weights from configs (nothing is downloaded), written with
``save_pretrained`` into ``OUT/NAME/``: ``sd3-tiny`` is diffusers' SD3 fast-test pipeline
(StableDiffusion3PipelineFastTests.get_dummy_components: SD3Transformer2DModel, two CLIPTextModelWithProjection, a
T5EncoderModel of tiny-random-t5's sizes, AutoencoderKL, FlowMatchEulerDiscreteScheduler) with CLIP and T5
tokenizers made from a small local vocabulary; ``sd3-wide`` the same with a 768-wide, 3-block transformer (about
300 MB of fp32 weights: bench_large.py --pipeline), ``sd3-512`` with a 512-wide one (124 MB); ``trivial`` is a
one-layer torch.export program (``trivial.pt2``), what the runtime's floor is measured on. As
tests/helpers/tiny_diffusion.py builds it (benchmarks never import from tests/).

Run as ``python pipeline_models.py OUT NAME[,NAME...]`` with the Python whose transformers writes the tokenizer files
both sides read (the bench runs it with Optimum's side venv: transformers 4.x writes the slow CLIP tokenizer's
vocab.json / merges.txt that its CLIPTokenizer needs; transformers 5 writes tokenizer.json alone). Prints one JSON
line of facts per model (its weight bytes: the safetensors files)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def clip_tokenizer(where: Path) -> Any:
    """A slow CLIP BPE tokenizer over single letters (each also as a word end ``x</w>``) and a few merges."""
    from transformers import CLIPTokenizer

    where.mkdir(parents=True, exist_ok=True)
    tokens = ["<|startoftext|>", "<|endoftext|>", "!"] + list(LETTERS) + [f"{c}</w>" for c in LETTERS]
    merges = ["a t</w>", "c at</w>", "o g</w>", "d og</w>"]
    tokens += ["at</w>", "cat</w>", "og</w>", "dog</w>"]
    (where / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (where / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return CLIPTokenizer(str(where / "vocab.json"), str(where / "merges.txt"), pad_token="!", model_max_length=77)


def t5_tokenizer() -> Any:
    """A fast T5 tokenizer: a Unigram model over the letters and a few words (tokenizers library objects)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import T5TokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(f"\u2581{w}", -1.0) for w in ("a", "cat", "dog", "photo", "of")] + [(c, -3.0) for c in LETTERS]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                           extra_ids=0, model_max_length=256)


def sd3(heads: int = 4, head_dim: int = 8, layers: int = 1) -> Any:
    """diffusers' SD3 fast-test pipeline, in eval mode (modules built from a config start in training mode); the
    transformer ``heads`` x ``head_dim`` wide and ``layers`` blocks deep (the fast test's 4 x 8, 1 block)."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, \
        StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=layers,
                                        attention_head_dim=head_dim, num_attention_heads=heads,
                                        caption_projection_dim=heads * head_dim, joint_attention_dim=32,
                                        pooled_projection_dim=64, out_channels=4)
    clip = CLIPTextConfig(bos_token_id=0, eos_token_id=1, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
                          num_attention_heads=4, num_hidden_layers=5, pad_token_id=2, vocab_size=64,
                          hidden_act="gelu", projection_dim=32)
    torch.manual_seed(0)
    text_encoder = CLIPTextModelWithProjection(clip)
    torch.manual_seed(0)
    text_encoder_2 = CLIPTextModelWithProjection(clip)
    torch.manual_seed(0)
    t5 = T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    text_encoder_3 = T5EncoderModel(t5)
    torch.manual_seed(0)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = clip_tokenizer(Path(tmp) / "clip")
        tokenizer_2 = clip_tokenizer(Path(tmp) / "clip2")
    parts = {"scheduler": FlowMatchEulerDiscreteScheduler(), "text_encoder": text_encoder,
             "text_encoder_2": text_encoder_2, "text_encoder_3": text_encoder_3, "tokenizer": tokenizer,
             "tokenizer_2": tokenizer_2, "tokenizer_3": t5_tokenizer(), "transformer": transformer, "vae": vae,
             "image_encoder": None, "feature_extractor": None}
    parts = {k: v.eval() if hasattr(v, "parameters") else v for k, v in parts.items()}
    return StableDiffusion3Pipeline(**parts)


def trivial(out: Path) -> None:
    """A one-layer program (Linear 4 -> 4, batch 1) as a .pt2: what any export of ours costs at the least."""
    import torch

    torch.manual_seed(0)
    program = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(1, 4),))
    torch.export.save(program, str(out))


# name -> (the transformer's heads, head width, blocks; a one-line description)
PIPELINES = {
    "sd3-tiny": ((4, 8, 1), "SD3 fast-test pipeline (diffusers' sizes; 1 transformer block), random weights"),
    "sd3-wide": ((12, 64, 3), "SD3 fast-test pipeline with a 768-wide, 3-block transformer, random weights"),
    "sd3-512": ((8, 64, 3), "SD3 fast-test pipeline with a 512-wide, 3-block transformer, random weights"),
    "sd3-2g": ((24, 64, 7), "SD3 fast-test pipeline with a 1536-wide, 7-block transformer (2.3 GB of fp32 weights: "
                            "past protobuf's 2 GB), random weights"),
}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2].split(",")
    for name in names:
        if name in PIPELINES:
            sizes, about = PIPELINES[name]
            sd3(*sizes).save_pretrained(out / name, safe_serialization=True)
            weights = sum(p.stat().st_size for p in (out / name).rglob("*.safetensors"))
        elif name == "trivial":
            trivial(out / "trivial.pt2")
            weights, about = (out / "trivial.pt2").stat().st_size, "Linear 4 -> 4, the runtime's floor"
        else:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(PIPELINES)}, trivial")
        print(json.dumps({"name": name, "about": about, "weights_bytes": weights}))


if __name__ == "__main__":
    main()
