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
    hints = {**dict(options.atc_hints or {}), **option_files(options, specs)}
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
        warnings.append(f"keep_dtype has no effect under {effective_precision(options)}: ATC ignores it there "
                        "(every node already keeps its original dtype)")
    from .precision_cfg import mode_warnings

    return warnings + mode_warnings(hints, effective_precision(options), options.soc_version)


# the file options that become a hint: ExportOptions field -> (the hint, the CLI flag)
FILE_HINTS = {"modify_mixlist": ("modify_mixlist", "--modify-mixlist"),
              "customize_dtypes": ("customize_dtypes", "--customize-dtypes")}
MAX_OPTION_FILE = 1 << 20  # bytes read from one such file


def option_files(options: Any, specs: dict[str, Any]) -> dict[str, Any]:
    """The hints given as files (--modify-mixlist FILE, --customize-dtypes FILE), read (bounded) and checked;
    an OptionsError names the flag, the file and the entry at fault."""
    from pathlib import Path

    out = {}
    for field, (hint, flag) in FILE_HINTS.items():
        path = getattr(options, field, None)
        if not path:
            continue
        p = Path(path)
        if not p.is_file():
            raise OptionsError(f"{flag} {path}: not a file; pass the path of the JSON/cfg file to hand to ATC")
        with open(p, "rb") as f:
            raw = f.read(MAX_OPTION_FILE + 1)
        if len(raw) > MAX_OPTION_FILE:
            raise OptionsError(f"{flag} {path}: larger than {MAX_OPTION_FILE} bytes; is it the right file?")
        try:
            out[hint] = specs[hint].normalize(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, TypeError) as e:
            raise OptionsError(f"{flag} {path}: {e}") from e
        setattr(options, field, None)  # the manifest keeps the checked content (atc.hints), never the path
    return out


def effective_precision(options: Any) -> str:
    """precision_mode_v2 when given (it replaces precision_mode), else precision_mode."""
    return options.atc_hints.get("precision_mode_v2") or options.precision_mode
