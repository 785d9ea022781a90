"""The pipelines this package exports, as a table: each pipeline class's components in Optimum's folder names
(``text_encoder``..., ``transformer`` or ``unet``, ``vae_encoder``, ``vae_decoder``), and where its denoiser
reads CLIP's penultimate hidden state and pooled embedding (``POOLED_INTO``). A new pipeline of known component
classes is a row here (SDXL's two CLIPs and a ``text_time`` UNet were: its UNet's extra inputs come from the
UNet's own config, graphs.added_inputs); one whose denoiser takes inputs of its own kind (Flux's packed latents
and position ids) also needs its graph class in graphs.py."""
from __future__ import annotations

TASK = "text-to-image"  # what api.graphs answers for a pipeline: several graphs, planned here
KIND = "diffusion-pipeline"  # the multi-graph bundle kind

# pipeline class -> (its text encoders, its denoiser) by model_index.json's names
PIPELINES: dict[str, tuple[tuple[str, ...], str]] = {
    "StableDiffusion3Pipeline": (("text_encoder", "text_encoder_2", "text_encoder_3"), "transformer"),
    "StableDiffusionPipeline": (("text_encoder",), "unet"),
    "StableDiffusionXLPipeline": (("text_encoder", "text_encoder_2"), "unet"),
}
# pipeline class -> the denoiser input its CLIPs' pooled embeddings (``text_embeds``) feed; the pipelines listed here
# also read every CLIP's penultimate hidden state (each CLIP's graph outputs its hidden states), the rest the last
POOLED_INTO: dict[str, str] = {"StableDiffusion3Pipeline": "pooled_projections",
                               "StableDiffusionXLPipeline": "text_embeds"}

# the classes a model_index.json may name, by library (nothing else is imported: no remote code)
ALLOWED = {
    "diffusers": {"SD3Transformer2DModel", "UNet2DConditionModel", "AutoencoderKL", "FlowMatchEulerDiscreteScheduler",
                  "EulerDiscreteScheduler", "DDIMScheduler", "PNDMScheduler", "LMSDiscreteScheduler",
                  "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler", "DDPMScheduler", "LCMScheduler"},
    "transformers": {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "CLIPTokenizer",
                     "CLIPTokenizerFast", "T5Tokenizer", "T5TokenizerFast"},
}
# the parts model_index.json may list that the export leaves out (None in a fast-test pipeline)
OPTIONAL_PARTS = ("safety_checker", "feature_extractor", "image_encoder")
SCHEDULERS = {n for n in ALLOWED["diffusers"] if n.endswith("Scheduler")}


def components_of(pipeline_class: str) -> tuple[str, ...]:
    """The bundle's components for ``pipeline_class``, in order."""
    encoders, denoiser = PIPELINES[pipeline_class]
    return (*encoders, denoiser, "vae_encoder", "vae_decoder")


def tokenizer_of(encoder: str) -> str:
    """The tokenizer folder feeding text encoder ``encoder`` (``text_encoder_2`` -> ``tokenizer_2``)."""
    return encoder.replace("text_encoder", "tokenizer")
