"""The write and commit stages: the format stages its files (before validate), then finalizes and commits them."""
from __future__ import annotations

from ..context import ExportContext
from ..fs import atomic, digests


def write(ctx: ExportContext) -> str:
    """The format writes its artifact into a staging directory beside the output."""
    ctx.staging = atomic.staging_dir(ctx.output_path)
    ctx.files = ctx.format.write(ctx, ctx.staging)
    return f"{len(ctx.files)} files staged"


def commit(ctx: ExportContext) -> str:
    """The format finalizes the staged artifact (its manifest records the verdict), then moves it into place."""
    if not ctx.finalized:  # a sandboxed export finalized in its child
        ctx.format.finalize(ctx, ctx.staging)
    staged_manifest = ctx.staging / "manifest.json"
    ctx.manifest_sha256 = digests.sha256_file(staged_manifest) if staged_manifest.is_file() else None
    ctx.files = ctx.format.commit(ctx, ctx.staging)
    ctx.staging = None  # committed: nothing is left to discard, whatever happens next
    return f"{len(ctx.files)} files committed"
