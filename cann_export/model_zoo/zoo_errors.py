"""Errors of the model zoo: every one names the model/version/file involved and what to do next."""
from __future__ import annotations

from ..errors import EXIT_PARITY_FAILED, ExportError


class ZooError(ExportError):
    """A bad name, a missing model/version/alias, a refused input, an unreachable registry."""

    stage = "zoo"


class ZooConflictError(ZooError):
    """(name, version) is write-once: different bytes under a taken version."""


class ZooIntegrityError(ZooError):
    """A stored file does not match the sha256 in its manifest (nothing was loaded)."""

    exit_code = EXIT_PARITY_FAILED
