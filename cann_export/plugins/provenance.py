"""Provenance recorded in every artifact: tool and library versions, exporter, opset, time, source digest."""
from __future__ import annotations

import datetime as dt
import platform
from importlib import metadata
from typing import Any

from ..hooks.specs import hookimpl


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


@hookimpl
def provenance(ctx: Any) -> dict[str, str]:
    from .. import __version__

    loaded = ctx.loaded
    return {
        "tool": f"cann-export {__version__}",
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "onnxsim": _version("onnxsim"),
        "python": platform.python_version(),
        "exporter": ctx.capture.exporter,
        "opset": str(ctx.capture.opset),
        "created_utc": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": loaded.source_path or f"<in-memory {type(ctx.model).__name__}>",
        "source_kind": loaded.kind,
        "source_sha256": loaded.source_sha256 or "",
        **({"task": str(loaded.extras["task"])} if loaded.extras.get("task") else {}),
    }
