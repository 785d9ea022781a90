"""The publish stage: the committed artifact into the model zoo."""
from __future__ import annotations

from .. import errors
from ..context import ExportContext


def publish(ctx: ExportContext) -> str | None:
    """Publish the committed artifact to the model zoo (refused when parity failed)."""
    from . import publish as zoo_publish

    parity = ctx.reports.parity
    if parity is not None and not parity.passed:
        raise errors.PublishError("parity failed, so the artifact was not published; fix the model or the "
                                  "tolerances and export again", path=str(ctx.output_path))
    record = zoo_publish(model=str(ctx.output_path), name=ctx.options.publish, metadata=dict(ctx.metadata),
                         zoo=ctx.options.zoo)
    ctx.reports.publish = record if isinstance(record, dict) else getattr(record, "to_dict", lambda: {})()
    return f"{ctx.options.publish} version {ctx.reports.publish.get('version')}"
