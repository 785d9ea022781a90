"""The height and width a pipeline's graphs take: the latent sides (``height`` / ``width``, the UNet's and the VAE
decoder's input; ``side_range``) and the image's in pixels (``image_height`` / ``image_width``, the VAE encoder's:
the latent's times the VAE's scale factor). A side the VAE or the denoiser's patches cannot take is refused, at
export (``--dynamic``) and when the bundle's runner is called at it."""
from __future__ import annotations

from typing import Any

from ..errors import OptionsError

LATENT = ("height", "width")
IMAGE = ("image_height", "image_width")
# the denoisers whose graphs keep the latent sides of the model's sample size, and why (the run notes say it)
FIXED_SIDES = {
    "transformer": "SD3's transformer is exported at the latent sides of its sample_size: its patch embedding crops "
                   "the position table at (pos_embed_max_size - height) // 2, a guard torch.export cannot prove over "
                   "a range (Constraints violated); with the crop as a gather the capture is right but spends "
                   "minutes propagating symbolic sizes through every op (measured on the tiny pipeline: 187 s "
                   "torch.export + 279 s ONNX translation against 14 s with the batch alone). ATC's static path "
                   "takes one size per graph anyway",
}


def side_range(denoiser: Any, side: int) -> tuple[int, int]:
    """The latent height / width the graphs take: half to twice the model's sample size, within SD3's position
    table (``pos_embed_max_size`` patches)."""
    high = side * 2
    table = getattr(denoiser.config, "pos_embed_max_size", None)
    if isinstance(table, int) and table > 0:
        high = min(high, table * patch_size(denoiser))
    return max(2, side // 2), max(high, side + 1)


def patch_size(denoiser: Any) -> int:
    patch = getattr(denoiser.config, "patch_size", None)
    return patch if type(patch) is int and patch > 0 else 1


def multiples(scale: int, patch: int) -> dict[str, int]:
    """What each side must be a multiple of: a latent side of the patch size, an image side of the VAE's scale
    factor times that (diffusers' own check_inputs for SD3)."""
    return {**{d: patch for d in LATENT}, **{d: scale * patch for d in IMAGE}}


def check_asked(pipe: Any, dynamic: Any) -> None:
    """The user's ``--dynamic`` ranges and gears of a side: every size a multiple of what the VAE and the patches
    take (OptionsError naming the flag and the sizes that fit)."""
    from ..bundle.graph_ranges import parse_ranges
    from .known_pipelines import PIPELINES

    if type(pipe).__name__ not in PIPELINES:
        return  # the planner refuses it, naming the pipelines this tool exports
    _, denoiser = PIPELINES[type(pipe).__name__]
    patch = patch_size(getattr(pipe, denoiser))
    need = multiples(int(pipe.vae_scale_factor), patch)
    for r in parse_ranges(dynamic):
        step = need.get(r.dim)
        wrong = [v for v in (r.gears or (r.low, r.high)) if step and v % step]
        if wrong:
            what = "image sides in pixels" if r.dim in IMAGE else "latent sides"
            why = f"the VAE's scale factor {pipe.vae_scale_factor} x the patch size {patch}" if r.dim in IMAGE \
                else f"the {denoiser}'s patch size {patch}"
            low, high = -(-r.low // step) * step, r.high // step * step
            raise OptionsError(f"--dynamic {r.text}: {r.dim} {wrong[0]} is not a multiple of {step} ({why}); "
                               f"{what} of this {type(pipe).__name__} are multiples of {step}: give multiples of "
                               f"{step} (e.g. {r.dim}={low}..{high})")


def input_ranges(own: dict[str, Any]) -> dict[str, list[tuple[int, int] | None]]:
    """A component's ATC ``--input_shape`` (its manifest's command) as ``{input: [(min, max) per axis]}``: a fixed
    size is (size, size), a range ``lo~hi`` its ends, a gear's ``-1`` None."""
    command = (own.get("atc") or {}).get("command") or []
    shape = next((a.split("=", 1)[1] for a in command if isinstance(a, str) and a.startswith("--input_shape=")), "")
    out: dict[str, list[tuple[int, int] | None]] = {}
    for part in shape.split(";"):
        name, _, dims = part.rpartition(":")
        axes: list[tuple[int, int] | None] = []
        for dim in dims.split(","):
            low, _, high = dim.partition("~")
            ok = low.isdigit() and (high.isdigit() or not high)
            axes.append((int(low), int(high or low)) if ok else None)
        out[name] = axes
    return out


def latent_limits(components: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """The latent sides every graph of the loop takes (the denoiser's and the VAE decoder's first input), from
    their component manifests' ATC input shapes."""
    limits: dict[str, tuple[int, int]] = {}
    for own in components.values():
        first = own["model"]["inputs"][0]["name"]
        axes = input_ranges(own).get(first, [])
        for dim, found in zip(LATENT, axes[2:4], strict=False):
            if found is not None:
                was = limits.get(dim, found)
                limits[dim] = (max(found[0], was[0]), min(found[1], was[1]))
    return limits


def check_latents(latents: Any, scale: int, limits: dict[str, tuple[int, int]]) -> None:
    """The denoiser called on ``latents`` (the runner at some height and width): their sides must be ones every
    graph of the loop takes (OptionsError naming the image sizes that fit)."""
    for dim, side in zip(LATENT, tuple(latents.shape[-2:]), strict=True):
        low, high = limits.get(dim, (1, 1 << 20))
        if not low <= int(side) <= high:
            raise OptionsError(f"{dim} {int(side) * scale}: this bundle's graphs take latent {dim}s {low}..{high}, "
                               f"images of {low * scale}..{high * scale} pixels (the VAE's scale factor {scale}); "
                               f"call it with a {dim} in that range, or export again with --dynamic {dim}=LO..HI "
                               "(latent sides) to widen it")
