"""Checking ATC hints before any heavy work: known names, valid values, combinations ATC refuses."""
from __future__ import annotations

from typing import Any

from ..errors import OptionsError
from ..options import check_soc_version
from ..hooks import manager

DEFAULT_PRECISION_MODE = "force_fp16"


def resolve(options: Any) -> list[str]:
    """Normalise ``options.atc_hints`` in place; return warnings. Raises OptionsError naming both
    options of a refused combination, or listing the known hints for an unknown one."""
    specs = manager.registry().atc_hints()
    hints = dict(options.atc_hints or {})
    unknown = sorted(k for k in hints if k not in specs)
    if unknown:
        raise OptionsError(f"unknown ATC hint(s) {', '.join(unknown)}; known hints: {', '.join(sorted(specs))} "
                           "(a plugin can register more with register_atc_hints)")
    for key, value in list(hints.items()):
        try:
            hints[key] = specs[key].normalize(value)
        except (ValueError, TypeError) as e:
            raise OptionsError(f"ATC hint {key}={value!r}: {e} (ATC would refuse it with E10001, an invalid "
                               "option value)") from e
    explicit = set(hints)
    if options.precision_mode != DEFAULT_PRECISION_MODE:
        explicit.add("precision_mode")
    for key in sorted(explicit):
        clash = sorted(set(getattr(specs.get(key), "conflicts", ())) & explicit)
        if clash:
            raise OptionsError(f"ATC refuses {key} together with {clash[0]}; pass only one of them")
    if "precision_mode" in hints:
        options.precision_mode = hints["precision_mode"]
    if "soc_version" in hints:
        options.soc_version = check_soc_version(hints["soc_version"], "--atc-hint soc_version")
    options.atc_hints = hints
    warnings = []
    if hints.get("keep_dtype") and effective_precision(options) in ("must_keep_origin_dtype", "origin"):
        warnings.append(f"keep_dtype has no effect under {effective_precision(options)}: every node already "
                        "keeps its original dtype")
    return warnings


def effective_precision(options: Any) -> str:
    """precision_mode_v2 when given (it replaces precision_mode), else precision_mode."""
    return options.atc_hints.get("precision_mode_v2") or options.precision_mode
