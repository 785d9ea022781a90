"""Example inputs from the recorded calls of an in-memory model (inputs/tracking.py) that are the model's, not
only the last call's: an input the training calls passed but the last call left out is kept (the fullest
call is used), and an axis 0 the calls varied becomes a dynamic batch (``extras["recorded_batch"]``, read
by inputs/dynamic_axes.resolve)."""
from __future__ import annotations

import warnings
from typing import Any

LAST = "the last recorded forward call"


def _named(key: Any, accepted: list[str]) -> str:
    if isinstance(key, int):
        return accepted[key] if key < len(accepted) else f"positional input {key}"
    return str(key)


def choose_call(ctx: Any, accepted: list[str]) -> tuple[tuple[tuple, dict], str]:
    """The call whose inputs the export uses, and how it is described; records the batch axes the calls varied
    and, when an input seen before cannot be kept, a warning naming it (manifest and Python warning)."""
    from .tracking import input_keys, recorded_history, recorded_inputs

    last = recorded_inputs(ctx.source)
    history = recorded_history(ctx.source)
    if history is None:
        return last, LAST

    def names(keys: Any) -> set[str]:  # positional and keyword spellings of one input are one name
        return {_named(k, accepted) for k in keys}

    call, source = last, LAST
    have, fullest = names(input_keys(*last)), names(history.fullest_keys)
    if have < fullest:  # the fullest call passed everything the last one did, and more
        call = history.fullest
        added = ", ".join(sorted(fullest - have))
        source = f"the fullest recorded forward call (the last one did not pass {added})"
        ctx.reports.warnings.inputs = (f"the model's last recorded call did not pass {added}; the export keeps it, "
                                       "with the inputs of the latest call that passed it")
    dropped = sorted(names(history.seen) - names(input_keys(*call)))
    if dropped:
        message = (f"input(s) {', '.join(dropped)} seen in earlier calls of the model are left out of the export: "
                   "no recorded call passed them with every input of the last call; pass example_inputs= with "
                   "every input to keep them")
        ctx.reports.warnings.inputs = message
        warnings.warn(f"cann.torch.export: {message}", stacklevel=2)
    used, batch = names(input_keys(*call)), {}
    for key, (low, high) in history.batch.items():  # x by position in one call and by name in another: one input
        name = _named(key, accepted)
        was = batch.get(name, (low, high))
        batch[name] = (min(was[0], low), max(was[1], high))
    ctx.loaded.extras["recorded_batch"] = {n: s for n, s in batch.items() if s[0] != s[1] and n in used}
    return call, source
