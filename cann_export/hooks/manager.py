"""The plugin manager: default plugins, third-party entry points and typed registry access."""
from __future__ import annotations

import importlib
import os
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from ..errors import PluginError
from . import contracts
from . import specs as hookspecs

if TYPE_CHECKING:
    import click

    from ..context import ExportContext
    from ..pipeline.stage import Stage

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
    "cann_export.plugins.validators",
    "cann_export.plugins.lint_command",
    "cann_export.plugins.report_command",
    "cann_export.plugins.golden_command",
    "cann_export.plugins.stages",
    "cann_export.plugins.inputs",
    "cann_export.plugins.hf",
)


class _Loaded:
    """The process-wide plugin manager, built on first use; ``reset()`` forgets it so the next use reloads."""

    def __init__(self) -> None:
        self.pm: pluggy.PluginManager | None = None

    def reset(self) -> None:
        self.pm = None


_loaded = _Loaded()
_entry_point_dists: dict[str, tuple[str, str]] = {}  # plugin name -> (distribution, version)


def _allowed_entry_points() -> set[str] | None:
    """``CANN_EXPORT_LOAD_PLUGINS`` is an allow-list (comma separated); set but empty loads none."""
    raw = os.environ.get("CANN_EXPORT_LOAD_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager, loading plugins on first use."""
    if _loaded.pm is None:
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
                if ep.dist is not None:
                    _entry_point_dists[ep.name] = (ep.dist.metadata["Name"], ep.dist.version)
        check_pending(pm)
        _loaded.pm = pm
    return _loaded.pm


def check_pending(pm: pluggy.PluginManager) -> None:
    """Refuse a hookimpl that implements no hook (a misspelled ``register_formatz`` would otherwise be
    ignored without a word): a PluginError naming the plugin, the hook and the closest real hook."""
    import difflib

    hooks = [n for n, f in vars(hookspecs).items() if hasattr(f, "cann_export_spec")]
    for name, caller in list(vars(pm.hook).items()):
        if name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if not impl.optionalhook:
                close = difflib.get_close_matches(name, hooks, n=1)
                raise PluginError(f"plugin {impl.plugin_name!r} implements {name!r}, which is not a cann_export hook"
                                  + (f"; did you mean {close[0]!r}?" if close else "")
                                  + f" (the hooks: {', '.join(sorted(hooks))}). Fix the plugin or leave it out "
                                  "with CANN_EXPORT_LOAD_PLUGINS")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise PluginError(f"plugin {pm.get_name(e.plugin)!r}: {e}") from e


def _collect(hook: Any, hook_name: str) -> dict[str, Any]:
    """Call a ``register_*`` hook and return ``{name: object}``; duplicate names and objects that miss a
    member of the extension point's contract are errors naming the plugin's object."""
    contract = contracts.CONTRACTS.get(hook_name)
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
        missing = contracts.missing_members(obj, contract) if contract else []
        if missing:
            raise PluginError(f"{hook_name}: {name!r} lacks {', '.join(missing)} (see cann_export.hooks.contracts."
                              f"{contract.__name__})")
        found[name] = obj

    hook(register=register)
    return found


class Registry:
    """Typed access to every extension point; the only place that calls the plugin manager's hooks."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm

    def loaders(self) -> dict[str, contracts.Loader]:
        return _collect(self._pm.hook.register_loaders, "register_loaders")

    def passes(self) -> list[contracts.Pass]:
        """Passes in run order."""
        found = _collect(self._pm.hook.register_passes, "register_passes")
        return sorted(found.values(), key=lambda p: p.order)

    def exporters(self) -> list[contracts.Exporter]:
        """Exporters in the order they are tried (descending priority)."""
        found = _collect(self._pm.hook.register_exporters, "register_exporters")
        return sorted(found.values(), key=lambda e: -e.priority)

    def formats(self) -> dict[str, contracts.Format]:
        return _collect(self._pm.hook.register_formats, "register_formats")

    def validators(self) -> list[contracts.Validator]:
        return list(_collect(self._pm.hook.register_validators, "register_validators").values())

    def backends(self) -> dict[str, contracts.Backend]:
        return _collect(self._pm.hook.register_backends, "register_backends")

    def atc_hints(self) -> dict[str, contracts.AtcHint]:
        return _collect(self._pm.hook.register_atc_hints, "register_atc_hints")

    def input_providers(self) -> list[contracts.InputProvider]:
        """Input providers in the order they are tried (descending priority)."""
        found = _collect(self._pm.hook.register_input_providers, "register_input_providers")
        return sorted(found.values(), key=lambda p: -p.priority)

    def run_stage(self, stage: Stage, ctx: ExportContext) -> str | None:
        """One pipeline stage through its plugins' wrappers (the timer) and the default body."""
        return self._pm.hook.run_stage(stage=stage, ctx=ctx)

    def add_commands(self, cli: click.Group) -> None:
        self._pm.hook.register_commands(cli=cli)

    def provenance(self, ctx: ExportContext) -> dict[str, str]:
        """Every plugin's provenance pairs merged (earlier-registered plugins win on a clash)."""
        merged: dict[str, str] = {}
        for part in reversed(self._pm.hook.provenance(ctx=ctx)):
            merged.update(part or {})
        return merged


def registry() -> Registry:
    """The typed facade over the process-wide plugin manager (a plugin registered since it loaded is
    checked for misspelled hooks here)."""
    pm = get_plugin_manager()
    check_pending(pm)
    return Registry(pm)


def describe_plugins() -> list[dict[str, Any]]:
    """Name, distribution, version and hooks of every registered plugin (for ``cann-export plugins``)."""
    pm = get_plugin_manager()
    by_package = _PackageDistributions()
    rows = []
    for name, plugin in pm.list_name_plugin():
        dist, version = _distribution_of(name, plugin, by_package)
        rows.append(
            {
                "name": name,
                "distribution": dist,
                "version": version,
                "builtin": name in DEFAULT_PLUGINS,
                "hooks": sorted(h.name for h in pm.get_hookcallers(plugin) or []),
            }
        )
    return rows


class _PackageDistributions:
    """``importlib.metadata.packages_distributions()``, computed at most once and only when a plugin is
    neither ours nor an entry point's (it reads every installed distribution's file list: ~0.5 s)."""

    def __init__(self) -> None:
        self._mapping: dict[str, list[str]] | None = None

    def get(self, top: str) -> list[str]:
        if self._mapping is None:
            self._mapping = metadata.packages_distributions()
        return self._mapping.get(top, [])


def _own_distribution() -> tuple[str, str]:
    """cann-export's own distribution and installed version (the package's version when run from a tree)."""
    try:
        return "cann-export", metadata.version("cann-export")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return "cann-export", __version__


def _distribution_of(name: str, plugin: Any, by_package: _PackageDistributions) -> tuple[str | None, str | None]:
    """The installed distribution that ships ``plugin``: from its entry point, ours for a module of this
    package, else from its module's top-level package; (None, None) for a plugin defined outside any
    installed distribution."""
    if name in _entry_point_dists:
        return _entry_point_dists[name]
    module = getattr(plugin, "__name__", None) if isinstance(plugin, type(os)) else type(plugin).__module__
    top = (module or name).split(".")[0]
    if top == __name__.split(".")[0]:
        return _own_distribution()
    for dist_name in by_package.get(top):
        try:
            return dist_name, metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            continue
    return None, None
