"""The typed contract of every extension point: what the core reads and calls on a registered object.

Built-ins satisfy these exactly as third-party plugins must; the core uses nothing else (no name
comparisons with built-ins, no private methods). ``typing.Protocol`` keeps them structural: a plugin
needs no base class, only these attributes and methods. ``check(obj, Contract)`` names what is missing.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Loader(Protocol):
    """Turns a model file into a LoadedModel (the load stage). Highest ``priority`` that ``matches`` wins."""

    name: str
    priority: int

    def matches(self, path: Path) -> bool: ...

    def load(self, path: Path, options: Any) -> Any: ...  # -> pipeline.LoadedModel


@runtime_checkable
class Pass(Protocol):
    """A strip/optimize pass, run in ascending ``order``. It implements any of ``apply_module(model, ctx)``
    (strip stage, torch module), ``apply_graph(onnx_model, ctx)`` (optimize, before onnxsim) and
    ``apply_final_graph(onnx_model, ctx)`` (after onnxsim); each returns the new model."""

    name: str
    order: int


PASS_METHODS = ("apply_module", "apply_graph", "apply_final_graph")


@runtime_checkable
class Exporter(Protocol):
    """Captures ONNX (the capture stage); tried in descending ``priority`` until a valid graph comes back."""

    name: str
    priority: int

    def supports(self, model: Any) -> bool: ...

    def export(self, model: Any, ctx: Any) -> Any: ...  # -> onnx.ModelProto


@runtime_checkable
class Format(Protocol):
    """Writes an artifact. ``write`` stages files (and sets ``ctx.onnx_path``), ``finalize`` runs after
    validation (it sets ``ctx.manifest``), ``commit`` moves the staged artifact into ``ctx.output_path``.

    What the pipeline does for a format comes from its declarations, never from its name:
    ``atc_opsets`` (the opsets ATC accepts, or None when the artifact is not headed for ATC),
    ``device_parity`` (run the device-precision emulation), ``lint`` (run the ATC lint)."""

    name: str
    description: str
    is_directory: bool
    atc_opsets: range | None
    device_parity: bool
    lint: bool

    def write(self, ctx: Any, staging: Path) -> list[Path]: ...

    def finalize(self, ctx: Any, staging: Path) -> None: ...

    def commit(self, ctx: Any, staging: Path) -> list[Path]: ...


@runtime_checkable
class Validator(Protocol):
    """Checks an export at ``stage`` ("lint" before writing, "validate" after) for the formats it names
    (a tuple of names, or "*"). ``check`` returns a report with at least ``{"passed": bool}``; a lint
    report lists ``findings`` (dicts with ``severity`` and ``message``)."""

    name: str
    stage: str
    formats: Any  # tuple[str, ...] | "*"

    def check(self, ctx: Any) -> dict[str, Any]: ...


@runtime_checkable
class Backend(Protocol):
    """A device models run on. ``priority`` orders the candidates for ``auto``; ``auto`` says whether the
    pipeline's ``--backend auto`` may pick it at all (an emulator is chosen by name only)."""

    name: str
    device: str
    description: str
    priority: int
    auto: bool

    def available(self) -> tuple[bool, str]: ...

    def activate(self) -> str: ...


@runtime_checkable
class AtcHint(Protocol):
    """An ATC option a user may pass. ``normalize`` raises ValueError listing the accepted values.
    ``conflicts``: hints ATC refuses alongside it. ``advisory``: kept in the manifest only. Otherwise it is
    rendered into atc/convert.sh: ``render(value)`` returns the command-line arguments (and may be absent,
    then ``--name=value`` is passed, lists comma-joined)."""

    name: str
    advisory: bool
    conflicts: tuple[str, ...]

    def normalize(self, value: Any) -> Any: ...


@runtime_checkable
class InputProvider(Protocol):
    """Gives the example inputs of the prepare stage: the providers are tried in descending ``priority`` and
    the first whose ``provide`` answers wins. ``provide`` returns ``({input name: tensor}, where they came
    from)`` or None when it has nothing for this export; it raises PrepareError for inputs it cannot use."""

    name: str
    priority: int

    def provide(self, ctx: Any) -> tuple[dict[str, Any], str] | None: ...


CONTRACTS: dict[str, type] = {
    "register_loaders": Loader, "register_passes": Pass, "register_exporters": Exporter,
    "register_formats": Format, "register_validators": Validator, "register_backends": Backend,
    "register_atc_hints": AtcHint, "register_input_providers": InputProvider,
}


def missing_members(obj: Any, contract: type) -> list[str]:
    """The attributes and methods of ``contract`` that ``obj`` lacks."""
    names = [n for n in getattr(contract, "__annotations__", {})]
    names += [n for n, v in vars(contract).items() if callable(v) and not n.startswith("_")]
    missing = [n for n in dict.fromkeys(names) if not hasattr(obj, n)]
    if contract is Pass and not any(hasattr(obj, m) for m in PASS_METHODS):
        missing.append(" or ".join(PASS_METHODS))
    return missing


RegisterFn = Callable[[Any], None]
