"""The plugin manager: default plugins, third-party entry points and typed registry access."""
from __future__ import annotations

import importlib
import os
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError

ENTRY_POINT_GROUP = "cann_export"

# Built-ins, registered exactly like third-party plugins.
DEFAULT_PLUGINS = (
    "cann_export.plugins.loaders",
    "cann_export.plugins.strip",
    "cann_export.plugins.quant",
    "cann_export.plugins.capture",
    "cann_export.plugins.formats",
    "cann_export.plugins.om",
    "cann_export.plugins.zoo_cli",
    "cann_export.plugins.atc",
    "cann_export.plugins.provenance",
    "cann_export.plugins.backends",
    "cann_export.validators.parity",
    "cann_export.validators.atc_lint",
)

_pm: pluggy.PluginManager | None = None


def _allowed_entry_points() -> set[str] | None:
    """``CANN_EXPORT_LOAD_PLUGINS`` is an allow-list (comma separated); set but empty loads none."""
    raw = os.environ.get("CANN_EXPORT_LOAD_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager, loading plugins on first use."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("cann_export")
        pm.add_hookspecs(hookspecs)
        for module_name in DEFAULT_PLUGINS:
            pm.register(importlib.import_module(module_name), name=module_name)
        allowed = _allowed_entry_points()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if pm.get_plugin(ep.name) is None:
                pm.register(ep.load(), name=ep.name)
        _pm = pm
    return _pm


def collect(hook_name: str) -> dict[str, Any]:
    """Call a ``register_*`` hook and return ``{name: object}``; duplicate names are an error."""
    pm = get_plugin_manager()
    found: dict[str, Any] = {}

    def register(obj: Any) -> None:
        name = getattr(obj, "name", None)
        if not name:
            raise PluginError(f"{hook_name}: registered object {obj!r} has no name")
        if name in found:
            raise PluginError(
                f"{hook_name}: two plugins register {name!r}; rename one or disable a plugin "
                "with CANN_EXPORT_LOAD_PLUGINS"
            )
        found[name] = obj

    getattr(pm.hook, hook_name)(register=register)
    return found


def call_provenance(ctx: Any) -> dict[str, str]:
    """Merge every plugin's provenance pairs."""
    merged: dict[str, str] = {}
    for part in reversed(get_plugin_manager().hook.provenance(ctx=ctx)):
        merged.update(part or {})
    return merged


def describe_plugins() -> list[dict[str, Any]]:
    """Name, version and hooks of every registered plugin (for ``cann-export plugins``)."""
    pm = get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    from . import __version__

    rows = []
    for name, plugin in pm.list_name_plugin():
        dist = dists.get(id(plugin))
        rows.append(
            {
                "name": name,
                "version": dist.version if dist else __version__,
                "builtin": name in DEFAULT_PLUGINS,
                "hooks": sorted(h.name for h in pm.get_hookcallers(plugin) or []),
            }
        )
    return rows
