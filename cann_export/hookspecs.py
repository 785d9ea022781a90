"""Every hook cann-export calls. Plugins implement them with ``@cann_export.hookimpl``.

Registries use the register-callback pattern: the hook receives ``register`` and calls it once per
object it contributes. Names must be unique across plugins; a duplicate is an error, not last-wins.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("cann_export")
hookimpl = pluggy.HookimplMarker("cann_export")


@hookspec
def register_loaders(register: Callable[[Any], None]) -> None:
    """Register loaders: objects with ``name``, ``priority``, ``matches(path) -> bool`` and
    ``load(path, options) -> LoadedModel``. The first matching loader by descending priority wins."""


@hookspec
def register_passes(register: Callable[[Any], None]) -> None:
    """Register strip passes: objects with ``name``, ``order`` (ascending run order) and any of
    ``apply_module(model, ctx) -> model`` (strip stage, on the torch module), ``apply_graph(onnx_model, ctx)``
    (optimize stage, before onnxsim) and ``apply_final_graph(onnx_model, ctx)`` (after onnxsim)."""


@hookspec
def register_exporters(register: Callable[[Any], None]) -> None:
    """Register ONNX exporters for the capture stage: objects with ``name``, ``priority`` (tried in
    descending order), ``supports(model) -> bool`` and ``export(model, ctx) -> onnx.ModelProto``."""


@hookspec
def register_formats(register: Callable[[Any], None]) -> None:
    """Register output formats: objects with ``name``, ``description``, ``is_directory`` and
    ``write(ctx, staging: Path) -> list[Path]`` writing the artifact under the staging path."""


@hookspec
def register_validators(register: Callable[[Any], None]) -> None:
    """Register validators: objects with ``name``, ``formats`` (tuple of format names or ``"*"``) and
    ``check(ctx) -> dict`` returning a report with at least ``{"passed": bool}``."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add click commands to the ``cann-export`` group."""


@hookspec
def provenance(ctx: Any) -> dict[str, str]:
    """Return key/value pairs to record as provenance in the ONNX metadata and the manifest."""


@hookspec
def register_atc_hints(register: Callable[[Any], None]) -> None:
    """Register ATC hints a user may pass (``atc_hints={...}`` / ``--atc-hint``): objects with ``name``,
    ``advisory`` (kept in the manifest only), ``conflicts`` (names of hints ATC refuses alongside it) and
    ``normalize(value) -> value`` raising ValueError with the accepted values when ``value`` is wrong."""


@hookspec
def register_backends(register: Callable[[Any], None]) -> None:
    """Register devices models run on (QAT, the parity reference, ``cann.torch``): objects with ``name``,
    ``device`` (torch device string), ``available() -> (bool, reason)`` and ``activate() -> device``."""
