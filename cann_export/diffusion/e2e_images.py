"""The end-to-end check's images, written into the bundle at export time for report.html: diffusers' eager image,
the exported components' in onnxruntime (fp32) and under the device emulation, each a small PNG (a large image
scaled down to MAX_SIDE pixels on its longer side) under ``pipeline/images/``."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from .files import PIPELINE_DIR

IMAGES_DIR = "images"
IMAGE_FILES = {"eager": "eager.png", "fp32": "fp32.png", "device": "device.png"}
MAX_SIDE = 256


def png_bytes(image: Any, max_side: int = MAX_SIDE) -> bytes:
    """The first image of ``image`` (``output_type="np"``: [batch, height, width, channels] in [0, 1]) as PNG;
    NaN / Inf drawn black, as diffusers' own numpy_to_pil casts them."""
    import numpy as np
    from PIL import Image

    first = np.asarray(image, dtype=np.float64)
    first = first[0] if first.ndim == 4 else first
    first = np.nan_to_num(first, nan=0.0, posinf=1.0, neginf=0.0)
    pixels = (np.clip(first, 0.0, 1.0) * 255).round().astype(np.uint8)
    picture = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    if max(picture.size) > max_side:
        scale = max_side / max(picture.size)
        picture = picture.resize((max(1, round(picture.width * scale)), max(1, round(picture.height * scale))),
                                 Image.Resampling.LANCZOS)
    out = io.BytesIO()
    picture.save(out, format="PNG", optimize=True)
    return out.getvalue()


def write_images(images: dict[str, Any], root: Path) -> dict[str, str]:
    """Each of ``images`` (by IMAGE_FILES' keys) as a PNG under ``root/pipeline/images/``; their bundle paths."""
    from ..fs import atomic

    folder = root / PIPELINE_DIR / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for key, name in IMAGE_FILES.items():
        if key in images:
            atomic.write_bytes(folder / name, png_bytes(images[key]))
            written[key] = f"{PIPELINE_DIR}/{IMAGES_DIR}/{name}"
    return written
