"""The typed contract of every extension point: what the core reads and calls on a registered object.

Built-ins satisfy these exactly as third-party plugins must; the core uses nothing else (no name
comparisons with built-ins, no private methods). ``typing.Protocol`` keeps them structural: a plugin
needs no base class, only these attributes and methods. ``missing_members(obj, Contract)`` names what is
missing. Members a plugin may leave out are declared in ``OPTIONAL`` (their signatures in the
``*Optional`` Protocols below); the core reaches them only through ``optional(obj, Contract, name)``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the contracts name real classes; none of them is imported at run time
    import onnx

    from ..context import ExportContext, LoadedModel
    from ..options import ExportOptions


@runtime_checkable
class Loader(Protocol):
    """Turns a model file into a LoadedModel (the load stage). Highest ``priority`` that ``matches`` wins."""

    name: str
    priority: int

    def matches(self, path: Path) -> bool: ...

    def load(self, path: Path, options: ExportOptions) -> LoadedModel: ...


class LoaderOptional(Protocol):
    def matches_directory(self, path: Path) -> bool:
        """Whether this loader reads the model directory ``path`` (a directory is refused unless one does).
        Default: it reads no directory."""

    def adopt(self, module: Any, options: ExportOptions, inputs_given: bool) -> LoadedModel | None:
        """An in-memory ``nn.Module`` (the caller's, already copied) as this loader would load it from a file,
        or None to leave it as it is; ``inputs_given``: the caller passed example inputs (or a call was
        recorded). Default: None."""

    def graphs(self, source: Any, options: dict[str, Any]) -> str | None:
        """Whether exporting ``source`` (a path this loader reads, or an in-memory model it would ``adopt``)
        with export()'s keyword ``options`` gives several graphs: the multi-graph task (Optimum's name, e.g.
        ``text-generation-with-past``) or ``"auto"`` (``kv_cache`` asks for several; the model decides which),
        else None, a single-graph export. The core asks every loader that declares it (highest ``priority``
        first) before the single-graph pipeline. Default: None."""


@runtime_checkable
class Pass(Protocol):
    """A strip/optimize pass, run in ascending ``order``. It implements at least one of the methods of
    ``PassOptional`` (each returns the new model)."""

    name: str
    order: int


class PassOptional(Protocol):
    def apply_module(self, model: Any, ctx: ExportContext) -> Any:
        """Strip stage, on the torch module (an ``nn.Module``)."""

    def apply_graph(self, model: onnx.ModelProto, ctx: ExportContext) -> onnx.ModelProto:
        """Optimize stage, before onnxsim."""

    def apply_final_graph(self, model: onnx.ModelProto, ctx: ExportContext) -> onnx.ModelProto:
        """Optimize stage, after onnxsim."""


PASS_METHODS = ("apply_module", "apply_graph", "apply_final_graph")


@runtime_checkable
class Exporter(Protocol):
    """Captures ONNX (the capture stage); tried in descending ``priority`` until a valid graph comes back.
    ``model`` is an ``nn.Module``, an ``ExportedProgram`` or a ``ScriptModule``."""

    name: str
    priority: int

    def supports(self, model: Any) -> bool: ...

    def export(self, model: Any, ctx: ExportContext) -> onnx.ModelProto: ...


@dataclass
class Container:
    """A single file that carried a bundle: the Format whose ``unpack`` opened it, and its own header."""

    format: str
    header: dict[str, Any]


@dataclass
class CheckedBundle:
    """A bundle being validated, inspected or converted, as the core re-derived it. A Format's
    ``check_artifact`` and ``describe`` read it; ``options`` are the ATC options re-validated from the
    manifest (None when it holds no ``atc`` section), ``command`` the ATC command rendered from them."""

    directory: Path
    manifest: dict[str, Any]
    container: Container | None = None
    model: onnx.ModelProto | None = None
    options: ExportOptions | None = None
    command: list[str] = field(default_factory=list)
    keep_nodes: list[str] = field(default_factory=list)
    module_paths: dict[str, str] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


@dataclass
class ResultInfo:
    """What a format adds to an export's result: ``extras`` (keys merged into ``ExportResult.to_dict()``,
    i.e. ``--json``), ``label`` (what the CLI says it wrote; default the format's name) and ``notes``
    (lines the CLI prints after that)."""

    extras: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    notes: list[str] = field(default_factory=list)


@runtime_checkable
class Format(Protocol):
    """Writes an artifact. ``write`` stages files (and sets ``ctx.onnx_path``), ``finalize`` runs after
    validation (it sets ``ctx.manifest``), ``commit`` moves the staged artifact into ``ctx.output_path``.

    What the pipeline does for a format comes from its declarations, never from its name:
    ``atc_opsets`` (the opsets ATC accepts, or None when the artifact is not headed for ATC),
    ``device_parity`` (run the device-precision emulation), ``lint`` (run the ATC lint). What validate and
    inspect know of its artifact comes from its optional members (``FormatOptional``)."""

    name: str
    description: str
    is_directory: bool
    atc_opsets: range | None
    device_parity: bool
    lint: bool

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]: ...

    def finalize(self, ctx: ExportContext, staging: Path) -> None: ...

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]: ...


class FormatOptional(Protocol):
    """What a Format may add; the core does without each one (the default is in each docstring)."""

    def targets(self, output: Path) -> list[Path]:
        """The paths an export to ``output`` creates (checked before any work). Default: ``[output]``."""

    def writes(self, output: Path) -> tuple[str, ...]:
        """The relative paths an export to ``output`` stages (patterns: ``*`` within one path part, a ``**``
        part for any rest). Before commit, a staged file or directory outside them is refused
        (``bundle/staged.py``). Default: no names declared (links and special files are refused all the same)."""

    def unpack(self, path: Path, directory: Path) -> dict[str, Any] | None:
        """If ``path`` is a single file of this format carrying a bundle, extract the bundle into
        ``directory`` (bounded reads) and return the file's own header; else None, touching nothing."""

    def manifest_problems(self, manifest: dict[str, Any]) -> list[str]:
        """The format's own sections of a manifest that differ in shape from what it writes. Default: none."""

    def check_artifact(self, checked: CheckedBundle) -> list[str]:
        """Every way the bundle's format-specific files (and ``checked.container``) differ from what its
        manifest claims. Default: none beyond the core's checks (file table, graph, ATC options, parity)."""

    def describe(self, checked: CheckedBundle) -> dict[str, Any]:
        """Keys ``inspect`` adds to what it shows of a checked bundle (``notes``: lines the CLI prints).
        Default: none."""

    def runs_programs(self, options: ExportOptions) -> str | None:
        """Why this export runs an outside program (e.g. ATC), which the load sandbox would stop: the export
        then runs unconfined and says so. Default: None (it runs none)."""

    def result_info(self, manifest: dict[str, Any], output: Path) -> ResultInfo:
        """What an export's result (written to ``output``) says about the artifact beyond the common
        fields. Default: nothing."""

    exporter_order: tuple[str, ...]
    """The exporters ``--exporter auto`` tries first for this format, in order, before a loader's
    ``extras["exporter_order"]`` (capture/exporter_choice.py). Default: none (the loader's, else priority)."""

    def component_format(self) -> str | None:
        """The registered format each graph of a multi-graph export in this format is written in (a directory
        bundle with its manifest and parity data, so validate re-derives it); the bundle gets a top-level ATC
        script when that format declares ``atc_opsets``. None, or left out: a multi-graph export is refused in
        this format."""


@runtime_checkable
class Validator(Protocol):
    """Checks an export at ``stage`` ("lint" before writing, "validate" after) for the formats it names
    (a tuple of names, "*", or a predicate on the Format). ``check`` returns a report with at least
    ``{"passed": bool}``; a lint report lists ``findings`` (dicts with ``severity`` and ``message``)."""

    name: str
    stage: str
    formats: tuple[str, ...] | str | Callable[[Format], bool]

    def check(self, ctx: ExportContext) -> dict[str, Any]: ...


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
    rendered into atc/convert.sh (see ``AtcHintOptional.render``)."""

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

    def provide(self, ctx: ExportContext) -> tuple[dict[str, Any], str] | None: ...


class AtcHintOptional(Protocol):
    def render(self, value: Any) -> list[str]:
        """The convert.sh arguments for ``value``. Default: ``--name=value``, lists comma-joined."""


CONTRACTS: dict[str, type] = {
    "register_loaders": Loader, "register_passes": Pass, "register_exporters": Exporter,
    "register_formats": Format, "register_validators": Validator, "register_backends": Backend,
    "register_atc_hints": AtcHint, "register_input_providers": InputProvider,
}

OPTIONAL: dict[type, tuple[str, ...]] = {
    Loader: ("matches_directory", "adopt", "graphs"),
    Pass: PASS_METHODS,
    Format: ("targets", "writes", "unpack", "manifest_problems", "check_artifact", "describe", "result_info",
             "runs_programs", "component_format"),
    AtcHint: ("render",),
}
"""The members each contract lets a plugin leave out (their signatures: ``PassOptional``,
``FormatOptional``, ``AtcHintOptional``, ``LoaderOptional``)."""


def optional(obj: Any, contract: type, name: str) -> Callable[..., Any] | None:
    """``obj``'s optional member ``name`` of ``contract``, or None when it leaves it out. Asking for a
    member the contract does not declare is a bug in the core (KeyError), never a silent None."""
    if name not in OPTIONAL.get(contract, ()):
        raise KeyError(f"{contract.__name__} declares no optional member {name!r}")
    member = getattr(obj, name, None)
    return member if callable(member) else None


def missing_members(obj: Any, contract: type) -> list[str]:
    """The attributes and methods of ``contract`` that ``obj`` lacks, and optional members it defines as
    something other than a method."""
    names = [n for n in getattr(contract, "__annotations__", {})]
    names += [n for n, v in vars(contract).items() if callable(v) and not n.startswith("_")]
    missing = [n for n in dict.fromkeys(names) if not hasattr(obj, n)]
    extra = OPTIONAL.get(contract, ())
    missing += [f"{n} (not a method)" for n in extra if hasattr(obj, n) and not callable(getattr(obj, n))]
    if contract is Pass and not any(hasattr(obj, m) for m in PASS_METHODS):
        missing.append(" or ".join(PASS_METHODS))
    return missing

