"""The plan of a bundle, whatever model it came from: the graphs (components) to export with their example
inputs, and how they connect. A planner (hf/graph_plans.py for transformers decoders and encoder-decoders) makes
a ``Plan``; the bundle writer exports it and the checker re-derives its connections through ``KINDS``, the table of
bundle kinds: a new kind of bundle (a diffusers pipeline) is a new planner and one entry here."""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")  # a component's name: its directory, components/<name>


@dataclass
class Component:
    """One graph of a multi-graph bundle: its name (its directory, ``components/<name>``), its role, the module
    to export and its example inputs, by graph input name."""

    name: str
    role: str
    module: Any
    example_inputs: dict[str, Any]


@dataclass
class Plan:
    """The graphs and the ``connections`` between them: each ``(from component, output, to component, input)``
    says which output feeds which input (a component feeding itself is a loop, such as decode's cache)."""

    kind: str
    components: list[Component]
    connections: list[tuple[str, str, str, str]]
    notes: dict[str, Any] = field(default_factory=dict)
    kept: dict[str, list[Any]] = field(default_factory=dict, repr=False, compare=False)  # bundle/parity_reuse.py
    # each component's sizes for the parity budget (bundle/graph_shapes.py:module_elements), measured once: a later
    # component's budget counts the earlier ones that feed it (decode's, prefill's)
    sized: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # connections through a host step (a diffusers pipeline's scheduler, concatenation, guidance): recorded in the
    # manifest, never fed as is to a later graph's parity inputs
    host_connections: list[tuple[str, str, str, str]] = field(default_factory=list)
    # after the graphs are written (staging directory, results): extra top-level manifest sections and whether
    # they pass (a pipeline's end-to-end check)
    finish: Any = field(default=None, repr=False, compare=False)


# the table of bundle kinds: each kind's components in order (each one's role is its name) ...
KINDS: dict[str, tuple[str, ...]] = {
    "decoder-with-past": ("prefill", "decode"),
    "decoder-with-static-cache": ("prefill", "decode"),
    "encoder-decoder": ("encoder", "decoder"),
    "encoder-decoder-with-past": ("encoder", "decoder", "decoder_with_past"),
}
# ... and the module of the planner that wires it (``wiring(kind, outputs)``, ``run_notes(kind, ...)``: the rule
# export wrote the manifest with, which validate re-derives it with); a module name from this table, never a file
PLANNERS: dict[str, str] = dict.fromkeys(KINDS, "cann_export.hf.graph_plans")


def _planner(kind: str) -> Any:
    return importlib.import_module(PLANNERS[kind])


def wiring(kind: str, outputs: list[str]) -> list[tuple[str, str, str, str]]:
    """The connections of a ``kind`` bundle from the output names of its first graph, by its planner's rule."""
    return _planner(kind).wiring(kind, outputs)


def wiring_source(kind: str) -> str:
    """The component whose output names the connections of a ``kind`` bundle are derived from, by its planner."""
    return _planner(kind).wiring_source(kind)


def run_notes(kind: str, cache_length: int | None = None, batch: int = 1, decode_tokens: int = 1) -> dict[str, Any]:
    """The ``run`` notes of a ``kind`` bundle, by its planner (``decode_tokens``: what its loop graph takes)."""
    return _planner(kind).run_notes(kind, cache_length, batch, decode_tokens)


# bundle kinds whose components vary with the model (a diffusers pipeline: SD3's six graphs, a UNet pipeline's
# four) and so are not rows of KINDS: the module that checks such a bundle's wiring (``wiring_problems(manifest,
# owns)``) and names the files it carries beside its graphs (``carried_file(rel)``); a module name, never a file
CHECKERS: dict[str, str] = {"diffusion-pipeline": "cann_export.diffusion.check"}


# bundle kinds run back by a runner of their own (cann_export.load: ``runner(directory, manifest, path, **options)``);
# every other bundle runs as its graphs (bundle/graph_runner.py)
RUNNERS: dict[str, str] = {"diffusion-pipeline": "cann_export.diffusion.bundle_runner"}


def runner_module(kind: Any) -> Any:
    """The module that runs a ``kind`` bundle back as one model, or None (its components are run by name)."""
    return importlib.import_module(RUNNERS[kind]) if isinstance(kind, str) and kind in RUNNERS else None


def checker(kind: Any) -> Any:
    """The checking module of a bundle kind outside KINDS, or None."""
    return importlib.import_module(CHECKERS[kind]) if isinstance(kind, str) and kind in CHECKERS else None


def carried_file(kind: Any, rel: str) -> bool:
    """Whether ``rel`` is a file a ``kind`` bundle carries beside its graphs (a pipeline's configs, tokenizers)."""
    found = checker(kind)
    return bool(found is not None and found.carried_file(rel))

