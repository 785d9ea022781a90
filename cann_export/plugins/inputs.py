"""The built-in example-input providers (cann_export.inputs.providers)."""
from __future__ import annotations

from ..hooks.contracts import RegisterFn
from ..hooks.specs import hookimpl
from ..inputs.providers import BUILTIN


@hookimpl
def register_input_providers(register: RegisterFn) -> None:
    for provider in BUILTIN:
        register(provider)
