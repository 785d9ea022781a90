"""Built-in ATC hints: ATC's own option names with their normalisers and renderings."""
from __future__ import annotations

from ..atc.command import BUILTIN_HINTS
from ..hooks.specs import hookimpl


@hookimpl
def register_atc_hints(register):
    for spec in BUILTIN_HINTS:
        register(spec)
