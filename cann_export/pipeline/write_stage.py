"""The write and commit stages: the format stages its files (before validate), then finalizes them, and the
staged artifact is checked (``bundle/staged.py``) before it is committed."""
from __future__ import annotations

from pathlib import Path

from ..context import ExportContext
from ..errors import WriteError
from ..fs import atomic, digests


def write(ctx: ExportContext) -> str:
    """The format writes its artifact into a staging directory beside the output."""
    ctx.staging = atomic.staging_dir(ctx.output_path)
    ctx.files = ctx.format.write(ctx, ctx.staging)
    return f"{len(ctx.files)} files staged"


def commit(ctx: ExportContext) -> str:
    """The format finalizes the staged artifact (its manifest records the verdict), then moves it into place."""
    with digests.remembered():  # the check hashes the files the manifest's table was just built from
        if not ctx.finalized:  # a sandboxed export finalized in its child
            ctx.format.finalize(ctx, ctx.staging)
        check_staged(ctx)
    staged_manifest = ctx.staging / "manifest.json"
    ctx.manifest_sha256 = digests.sha256_file(staged_manifest) if staged_manifest.is_file() else None
    ctx.files = ctx.format.commit(ctx, ctx.staging)
    ctx.staging = None  # committed: nothing is left to discard, whatever happens next
    return f"{len(ctx.files)} files committed"


def check_staged(ctx: ExportContext) -> None:
    """Refuse a staged artifact that is not what the format writes (``bundle/staged.py``): the stages before
    commit ran the model's code (in the sandboxed child, or here), which may have written into the staging
    directory. The manifest committed and reported is the one read back from it."""
    from ..bundle.staged import staged_problems

    manifest, problems = staged_problems(ctx.staging, ctx.format, ctx.output_path, ctx.options)
    if problems:
        where = (f"the sandboxed stages ({ctx.reports.sandbox['kind']})" if ctx.sandbox_dir is not None
                 else "the stages before commit")
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        source = ctx.source if isinstance(ctx.source, (str, Path)) else None
        raise WriteError(f"{where} staged what --format {ctx.format.name} does not write: {shown}. Nothing was "
                         "committed. The model's code (a trusted pickle, --trust-remote-code, a crafted file) wrote "
                         "into the export; do not use this model file", path=str(source) if source else None,
                         stage="commit")
    if manifest is not None:
        ctx.manifest = manifest
