"""Every hook cann-export calls. Plugins implement them with ``@cann_export.hookimpl``.

Registries use the register-callback pattern: the hook receives ``register`` and calls it once per
object it contributes. Each object must satisfy its extension point's ``typing.Protocol`` in
``cann_export.hooks.contracts`` (every attribute and method the core uses; a missing one is a PluginError at
registration). Names must be unique across plugins; a duplicate is an error, not last-wins. The core calls
these hooks only through ``plugin_manager.registry()``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ..context import ExportContext
    from ..pipeline.stage import Stage

hookspec = pluggy.HookspecMarker("cann_export")
hookimpl = pluggy.HookimplMarker("cann_export")


@hookspec
def register_loaders(register: Callable[[Any], None]) -> None:
    """Register loaders (contracts.Loader): ``name``, ``priority``, ``matches(path)``, ``load(path, options) ->
    LoadedModel``. The matching loader with the highest priority wins."""


@hookspec
def register_passes(register: Callable[[Any], None]) -> None:
    """Register passes (contracts.Pass): ``name``, ``order`` (ascending run order) and any of
    ``apply_module(model, ctx)`` (strip stage, on the torch module), ``apply_graph(onnx_model, ctx)``
    (optimize stage, before onnxsim) and ``apply_final_graph(onnx_model, ctx)`` (after onnxsim)."""


@hookspec
def register_exporters(register: Callable[[Any], None]) -> None:
    """Register ONNX exporters (contracts.Exporter): ``name``, ``priority`` (tried in descending order),
    ``supports(model)`` and ``export(model, ctx) -> onnx.ModelProto``. ``--exporter NAME`` picks one."""


@hookspec
def register_formats(register: Callable[[Any], None]) -> None:
    """Register output formats (contracts.Format): ``name``, ``description``, ``is_directory``, the
    declarations ``atc_opsets`` / ``device_parity`` / ``lint``, and ``write`` / ``finalize`` / ``commit``."""


@hookspec
def register_validators(register: Callable[[Any], None]) -> None:
    """Register validators (contracts.Validator): ``name``, ``stage`` ("lint" or "validate"), ``formats``
    ("*", a tuple of format names, or a predicate on the Format) and ``check(ctx) -> {"passed": bool, ...}``."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add click commands to the ``cann-export`` group."""


@hookspec
def provenance(ctx: Any) -> dict[str, str]:
    """Return key/value pairs to record as provenance in the ONNX metadata and the manifest."""


@hookspec
def register_atc_hints(register: Callable[[Any], None]) -> None:
    """Register ATC hints a user may pass (``atc_hints={...}`` / ``--atc-hint``; contracts.AtcHint): ``name``,
    ``advisory`` (manifest only), ``conflicts``, ``normalize(value)`` raising ValueError with the accepted
    values, and optionally ``render(value) -> list[str]`` (convert.sh arguments; default ``--name=value``)."""


@hookspec
def register_backends(register: Callable[[Any], None]) -> None:
    """Register devices models run on (QAT, the parity reference, ``cann.torch``; contracts.Backend): ``name``,
    ``device``, ``description``, ``priority`` and ``auto`` (for ``--backend auto``), ``available() -> (bool,
    reason)`` and ``activate() -> device``."""


@hookspec(firstresult=True)
def run_stage(stage: Stage, ctx: ExportContext) -> str | None:
    """Run one pipeline stage and return its status. ``wrapper=True`` impls wrap every stage (``result =
    yield`` is the stage's status; the stage timer, plugins/stages.py, is one); a plain impl that returns a
    status replaces the stage's body, which is the default ``trylast`` impl (``stage.run(ctx)``)."""


@hookspec
def register_input_providers(register: Callable[[Any], None]) -> None:
    """Register example-input providers (contracts.InputProvider): ``name``, ``priority`` (tried in descending
    order) and ``provide(ctx) -> (feed dict, source description) | None``. The first that answers wins."""
