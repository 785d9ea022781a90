"""Tiny diffusers pipelines for tests, built offline: diffusers' own fast-test sizes (tests/pipelines/
stable_diffusion_3, stable_diffusion and stable_diffusion_xl ``get_dummy_components``), random weights, and CLIP /
T5 tokenizers made from a small local vocabulary (no hub access), written with ``save_pretrained``."""
from __future__ import annotations

import json
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
    return CLIPTokenizer(str(where / "vocab.json"), str(where / "merges.txt"), pad_token="!",
                         model_max_length=77)


def t5_tokenizer() -> Any:
    """A fast T5 tokenizer: a Unigram model over the letters and a few words (tokenizers library objects)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import T5TokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(f"\u2581{w}", -1.0) for w in ("a", "cat", "dog", "photo", "of")] + [(c, -3.0) for c in LETTERS]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                           extra_ids=0, model_max_length=256)


def _clip_config() -> Any:
    """The fast tests' CLIP text config of SD3 and SDXL (5 layers, width 32, projection 32)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(bos_token_id=0, eos_token_id=1, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
                          num_attention_heads=4, num_hidden_layers=5, pad_token_id=2, vocab_size=64,
                          hidden_act="gelu", projection_dim=32)


def sd3_components(seed: int = 0, layers: int = 1) -> dict[str, Any]:
    """diffusers' SD3 fast-test components (StableDiffusion3PipelineFastTests.get_dummy_components), with a local
    T5 of the tiny-random-t5 sizes and local tokenizers; ``layers``: the transformer's blocks (the fast test's 1)."""
    import tempfile

    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=layers,
                                        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
                                        joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
    clip = _clip_config()
    torch.manual_seed(seed)
    text_encoder = CLIPTextModelWithProjection(clip)
    torch.manual_seed(seed)
    text_encoder_2 = CLIPTextModelWithProjection(clip)
    torch.manual_seed(seed)
    t5 = T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    text_encoder_3 = T5EncoderModel(t5)
    torch.manual_seed(seed)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = clip_tokenizer(Path(tmp) / "clip")
        tokenizer_2 = clip_tokenizer(Path(tmp) / "clip2")
    return {"scheduler": FlowMatchEulerDiscreteScheduler(), "text_encoder": text_encoder,
            "text_encoder_2": text_encoder_2, "text_encoder_3": text_encoder_3, "tokenizer": tokenizer,
            "tokenizer_2": tokenizer_2, "tokenizer_3": t5_tokenizer(), "transformer": transformer, "vae": vae,
            "image_encoder": None, "feature_extractor": None}


def sd_components(seed: int = 0, time_cond_proj_dim: int | None = None) -> dict[str, Any]:
    """diffusers' StableDiffusionPipeline fast-test components, with a local CLIP tokenizer; ``time_cond_proj_dim``:
    an LCM-distilled UNet (its guidance-scale embedding) with diffusers' LCMScheduler, as its LCM fast test."""
    import tempfile

    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=2, attention_head_dim=2, time_cond_proj_dim=time_cond_proj_dim)
    torch.manual_seed(seed)
    vae = AutoencoderKL(block_out_channels=[4, 8], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4, norm_num_groups=2)
    torch.manual_seed(seed)
    clip = CLIPTextConfig(bos_token_id=0, eos_token_id=1, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
                          num_attention_heads=4, num_hidden_layers=5, pad_token_id=2, vocab_size=64)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = clip_tokenizer(Path(tmp) / "clip")
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1)
    if time_cond_proj_dim is not None:
        from diffusers import LCMScheduler

        scheduler = LCMScheduler.from_config(scheduler.config)
    return {"unet": unet, "scheduler": scheduler, "vae": vae, "text_encoder": CLIPTextModel(clip),
            "tokenizer": tokenizer, "safety_checker": None, "feature_extractor": None, "image_encoder": None}


def sdxl_components(seed: int = 0) -> dict[str, Any]:
    """diffusers' StableDiffusionXLPipeline fast-test components (a ``text_time`` UNet, two CLIPs, a two-block VAE),
    with local CLIP tokenizers."""
    import tempfile

    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(2, 4), layers_per_block=2, sample_size=32, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                                use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                                transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80,
                                cross_attention_dim=64, norm_num_groups=1)
    torch.manual_seed(seed)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        latent_channels=4, sample_size=128)
    clip = _clip_config()
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(clip)
    torch.manual_seed(seed)
    text_encoder_2 = CLIPTextModelWithProjection(clip)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, tokenizer_2 = clip_tokenizer(Path(tmp) / "clip"), clip_tokenizer(Path(tmp) / "clip2")
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1,
                                       beta_schedule="scaled_linear", timestep_spacing="leading")
    return {"unet": unet, "scheduler": scheduler, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "text_encoder_2": text_encoder_2, "tokenizer_2": tokenizer_2, "image_encoder": None,
            "feature_extractor": None}


def _eval(parts: dict[str, Any]) -> dict[str, Any]:
    """Modules built from a config are in training mode (T5's dropout on); from_pretrained gives eval mode."""
    return {k: v.eval() if hasattr(v, "eval") and hasattr(v, "parameters") else v for k, v in parts.items()}


def sd3_pipeline(seed: int = 0, layers: int = 1) -> Any:
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline(**_eval(sd3_components(seed, layers))).to("cpu")


def sd_pipeline(seed: int = 0, time_cond_proj_dim: int | None = None) -> Any:
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline(**_eval(sd_components(seed, time_cond_proj_dim)),
                                   requires_safety_checker=False).to("cpu")


def sdxl_pipeline(seed: int = 0) -> Any:
    from diffusers import StableDiffusionXLPipeline

    return StableDiffusionXLPipeline(**_eval(sdxl_components(seed))).to("cpu")


def overflow_t5(pipe: Any, factor: float = 5e4) -> Any:
    """``pipe``'s T5 (text_encoder_3) with every feed-forward's ``wi`` scaled up by ``factor`` and ``wo`` down by it:
    ReLU is positively homogeneous, so the fp32 output is unchanged, while the activations between ``wi`` and
    ``wo`` pass fp16's 65504 (T5-XXL's known fp16 damage, in a tiny model). The weights stay within fp16's range."""
    import torch

    with torch.no_grad():
        for block in pipe.text_encoder_3.encoder.block:
            feed_forward = block.layer[1].DenseReluDense
            feed_forward.wi.weight.mul_(factor)
            feed_forward.wo.weight.div_(factor)
    return pipe


def save(pipe: Any, where: Path) -> Path:
    pipe.save_pretrained(where, safe_serialization=True)
    return where
