"""Where things live inside a version directory (shared by the staging modules and the loaders)."""
from __future__ import annotations

WEIGHTS = "weights/model.safetensors"
PROGRAM = "architecture/program.pt2"
BUNDLE_PROGRAM = "torch/program.pt2"  # the torch.export program an atc_ready bundle carries (torch_program.py)
