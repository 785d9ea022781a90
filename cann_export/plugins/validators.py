"""Built-in validators: numeric parity of the written artifact (validate) and the ATC lint (lint)."""
from __future__ import annotations

from ..atc.lint import AtcLint
from ..hooks.specs import hookimpl
from ..validators.parity import ParityValidator


@hookimpl
def register_validators(register):
    register(ParityValidator())
    register(AtcLint())
