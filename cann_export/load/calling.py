"""How a model is called with named inputs: a module by keyword; a torch.export program as it was captured
(its positional inputs by position, its keyword inputs by name: ``export(model, (), {"input_ids": ...})``);
a TorchScript graph by position."""
from __future__ import annotations

from typing import Any


def program_keywords(program: Any) -> list[str]:
    """The inputs a torch.export program takes by keyword (the keys of its call spec's kwargs)."""
    spec = getattr(getattr(program, "call_spec", None), "in_spec", None)
    if spec is None or getattr(spec, "num_children", 0) != 2:
        return []
    return [str(k) for k in (spec.child(1).context or [])]


def split_call(kind: str, feed: dict[str, Any], names: list[str], keywords: list[str] | tuple[str, ...] = ()
               ) -> tuple[tuple, dict[str, Any]]:
    """``feed`` (name -> tensor) as the (args, kwargs) the model of ``kind`` takes; ``names``: the graph's
    inputs in order; ``keywords``: those a program takes by name."""
    if kind == "module":
        return (), dict(feed)
    named = set(keywords) if kind == "exported_program" else set()
    return (tuple(feed[n] for n in names if n not in named),
            {n: feed[n] for n in names if n in named})


def call(model: Any, kind: str, feed: dict[str, Any], names: list[str], keywords: Any = ()) -> Any:
    args, kwargs = split_call(kind, feed, names, keywords)
    return model(*args, **kwargs)
