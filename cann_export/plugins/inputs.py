"""The built-in example-input providers (cann_export.inputs.providers)."""
from __future__ import annotations

from collections.abc import Callable

from ..hooks.contracts import InputProvider
from ..hooks.specs import hookimpl
from ..inputs.providers import BUILTIN


@hookimpl
def register_input_providers(register: Callable[[InputProvider], None]) -> None:
    for provider in BUILTIN:
        register(provider)
