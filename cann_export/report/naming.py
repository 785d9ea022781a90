"""The model a multi-graph export's component pages name (report.html of ``components/NAME`` names the bundle's
model too): set around each component's export by bundle/multi_write.py, read by report/write_report.py."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_MODEL: ContextVar[str | None] = ContextVar("cann_export_report_model", default=None)


@contextlib.contextmanager
def model_named(name: str) -> Iterator[None]:
    """Within: the components an export writes name ``name`` (the multi-graph bundle) on their pages."""
    token = _MODEL.set(name)
    try:
        yield
    finally:
        _MODEL.reset(token)


def current_model() -> str | None:
    """The model named by the innermost ``model_named``, if any."""
    return _MODEL.get()
