"""The cyclic garbage collector of a process the CLI owns: off while the libraries and the model load, then
everything alive frozen (``gc.freeze``) and the collector back on.

Importing torch, transformers and diffusers makes 400-600 K long-lived objects, and the collector's full passes
over the growing heap while they load took 0.35-0.7 s of every export (6-8 passes: 9-14% of a DistilBERT's,
7% of a ViT's or a tiny SD3 pipeline's); each later full pass walked them all again. The CLI's entry points turn the
collector off (``hold``); when the first stage past ``load`` starts (or the load sandbox's child has returned)
``settle`` moves every object then alive into the permanent generation, as Python's documentation advises before a
fork (a forked child's collections then leave those pages alone), and turns the collector on. What the imports
left in reference cycles (a few hundred objects) stays. The Python API never changes the collector of the
process it runs in: only ``hold`` does, and only the CLI's process entry points call it."""
from __future__ import annotations

import gc

_held = False


def hold() -> None:
    """Turn the collector off until ``settle`` (a CLI process entry point, before anything heavy is imported)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def settle() -> None:
    """What ``hold`` turned off back on, with everything alive frozen; nothing when ``hold`` did not run."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()
