"""Built-in strip passes (checkpoint wrappers, Dropout, Conv+BatchNorm, Identity) and the graph clean-up."""
from __future__ import annotations

from ..hooks.specs import hookimpl
from ..passes.dedupe import DedupeInitializersPass
from ..passes.strip_passes import ConvBnPass, DropoutPass, GraphCleanupPass, IdentityPass, UnwrapCheckpointPass


@hookimpl
def register_passes(register):
    for p in (UnwrapCheckpointPass(), DropoutPass(), ConvBnPass(), IdentityPass(), GraphCleanupPass(),
              DedupeInitializersPass()):
        register(p)
