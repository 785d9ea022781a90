#!/usr/bin/env python
"""Why SD3's transformer keeps its latent sides fixed (diffusion/sides.py FIXED_SIDES): torch.export of the tiny
SD3 transformer (diffusers' fast-test sizes, built below as tests/helpers/tiny_diffusion.py builds it) with the
batch alone dynamic, with height and width dynamic too (diffusers' own code: the position table's crop raises
"Constraints violated"), and
with the crop rewritten as a gather (``--gather``: the capture succeeds; ``--onnx`` also times the ONNX translation
and compares onnxruntime with diffusers at 24 x 40).

    python benchmarks/bench_sd3_sides.py batch
    python benchmarks/bench_sd3_sides.py sides [--gather] [--onnx]

Measured on 2 shared cores under load (2026-12-06): batch 14 s; sides 21 s to the refusal; sides --gather 187 s
(244 s on a second run) in torch.export, 279 s more in the ONNX translation, onnxruntime within 4.8e-7. Stack
samples every 20 s sat in fake-tensor dispatch and sympy arithmetic on the symbolic sizes (sym_node, sym_eq)."""
from __future__ import annotations

import sys
import tempfile
import time
import types
from typing import Any
from pathlib import Path



def tiny_sd3_transformer() -> Any:
    """diffusers' SD3 fast-test transformer (StableDiffusion3PipelineFastTests.get_dummy_components)."""
    import torch
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    return SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8,
                                 num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                 pooled_projection_dim=64, out_channels=4)


def cropped_by_gather(self, height, width):  # noqa: ANN001, ANN201 - diffusers PatchEmbed.cropped_pos_embed's math
    import torch

    size = self.pos_embed_max_size
    h, w = height // self.patch_size, width // self.patch_size
    table = self.pos_embed.reshape(size, size, -1)
    rows = torch.arange(h) + (size - h) // 2
    cols = torch.arange(w) + (size - w) // 2
    grid = table.index_select(0, rows).index_select(1, cols)
    return grid.reshape(1, -1, grid.shape[-1])


def main() -> None:
    import torch
    from torch.export import Dim

    model = tiny_sd3_transformer().eval()
    if "--gather" in sys.argv:
        model.pos_embed.cropped_pos_embed = types.MethodType(cropped_by_gather, model.pos_embed)

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, h, e, p, t):  # noqa: ANN001, ANN201
            return self.model(hidden_states=h, encoder_hidden_states=e, pooled_projections=p, timestep=t,
                              return_dict=False)[0]

    args = (torch.randn(2, 4, 32, 32), torch.randn(2, 333, 32), torch.randn(2, 64), torch.tensor([500.0, 250.0]))
    batch = Dim("batch", min=1, max=64)
    first = {0: batch}
    if sys.argv[1] == "sides":
        first = {0: batch, 2: Dim("height", min=16, max=64), 3: Dim("width", min=16, max=64)}
    start = time.time()
    try:
        program = torch.export.export(Graph(), args, dynamic_shapes=(first, {0: batch}, {0: batch}, {0: batch}),
                                      strict=False)
    except Exception as e:  # noqa: BLE001 - the refusal is the measurement
        print(f"torch.export refused after {time.time() - start:.1f} s: {type(e).__name__}: {str(e)[:400]}")
        return
    print(f"torch.export {time.time() - start:.1f} s")
    if "--onnx" in sys.argv:
        import numpy as np
        import onnxruntime as ort

        start = time.time()
        path = Path(tempfile.mkdtemp()) / "sd3.onnx"
        torch.onnx.export(program, args, dynamo=True, optimize=False).save(str(path))
        print(f"ONNX translation {time.time() - start:.1f} s")
        other = (torch.randn(3, 4, 24, 40), torch.randn(3, 333, 32), torch.randn(3, 64), torch.tensor([9.0, 5.0, 1.0]))
        sess = ort.InferenceSession(str(path))
        got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), other, strict=True)})[0]
        with torch.no_grad():
            want = Graph()(*other).numpy()
        print(f"onnxruntime at 24 x 40: max abs difference {float(np.abs(got - want).max()):.2e}")


if __name__ == "__main__":
    main()
