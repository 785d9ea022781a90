"""Where things live inside a version directory (shared by the staging modules and the loaders)."""
from __future__ import annotations

WEIGHTS = "weights/model.safetensors"
PROGRAM = "architecture/program.pt2"
BUNDLE_PROGRAM = "torch/program.pt2"  # the torch.export program an atc_ready bundle carries (torch_program.py)
PIPELINE_KIND = "diffusion-pipeline"  # a multi-graph bundle of a diffusers pipeline (diffusion/known_pipelines.py)
PIPELINE_ARCH = "diffusers-pipeline"  # its architecture: the pipeline/ folder (model_index.json, safetensors)
