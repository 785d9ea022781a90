"""The Python API: export(), validate() and inspect(). The CLI and ``cann.torch`` call these."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from . import errors, pipeline
from .atc import hints as atc_hints
from .context import ExportContext
from .fs import atomic
from .hooks import manager
from .hooks.contracts import Format, ResultInfo, optional
from .options import ExportOptions, Tolerance, check_known_soc
from .pipeline.blas_threads import one_blas_thread
from .pipeline.stage import ProgressFn
from .progress import ProgressEvent
from .usage import surface

_OPTION_FIELDS = {f.name for f in dataclasses.fields(ExportOptions)} - {"export_format", "tolerance"}
_KEYWORDS = {**{f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(ExportOptions)},
             **dict.fromkeys(("atol", "rtol", "min_cosine", "example_inputs"))}  # export()'s, with defaults


def _api_spelling(function: Callable[..., Any]) -> Callable[..., Any]:
    """An ExportError leaving ``function`` names export()'s keyword arguments, not the CLI's flags, unless the
    command line called it (usage/surface.py)."""
    import functools

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except errors.ExportError as e:
            surface.respell(e, _KEYWORDS)
            raise
    return wrapper


@dataclass
class ExportResult:
    """What an export produced: files, manifest, parity report and the ONNX facts."""

    ok: bool
    format: str
    output: str
    files: list[str]
    onnx: dict[str, Any]
    parity: dict[str, Any] | None
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)
    published: dict[str, Any] | None = None  # the model zoo record when --publish was given
    manifest_sha256: str | None = None  # of the manifest.json written (pin it with validate --expect-sha256)
    sandbox: dict[str, Any] | None = None  # the load sandbox the stages before commit ran in, or why none

    def to_dict(self) -> dict[str, Any]:
        parity = self.parity or {"passed": None, "validated": False, "outputs": []}
        out = {"ok": self.ok, "format": self.format, "output": self.output, "files": self.files,
               "onnx": self.onnx, "parity": parity}
        if self.published is not None:
            out["published"] = self.published
        if self.manifest_sha256 is not None:
            out["manifest_sha256"] = self.manifest_sha256
        if self.sandbox is not None:
            out["sandbox"] = self.sandbox
        return {**out, **self.info().extras}

    def info(self) -> ResultInfo:
        """What the format says about its artifact beyond the common fields (its ``result_info``): extra
        ``--json`` keys, the label the CLI prints and notes."""
        from .hooks.contracts import Format, optional

        fmt = manager.registry().formats().get(self.format)
        result_info = optional(fmt, Format, "result_info") if fmt is not None else None
        return result_info(self.manifest, Path(self.output)) if result_info else ResultInfo()


def _options(export_format: str, kwargs: dict[str, Any]) -> ExportOptions:
    tol = kwargs.pop("tolerance", None) or Tolerance()
    if isinstance(tol, dict):
        tol = Tolerance(**tol)
    tol = tol.with_values(**{key: kwargs.pop(key, None) for key in ("atol", "rtol", "min_cosine")})
    unknown = sorted(set(kwargs) - _OPTION_FIELDS)
    if unknown:
        raise errors.OptionsError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTION_FIELDS))}")
    if "input_shapes" in kwargs:
        from .options import InputSpec, parse_input_shape

        kwargs["input_shapes"] = [s if isinstance(s, InputSpec) else parse_input_shape(s)
                                  for s in kwargs["input_shapes"]]
    if "dynamic" in kwargs:
        from .dynamic import as_axes

        kwargs["dynamic"] = as_axes(kwargs["dynamic"])
    return ExportOptions(export_format=export_format, tolerance=tol, **kwargs)


@_api_spelling
@one_blas_thread
def export(model: Any, output_path: str | Path, export_format: str = "atc_ready", example_inputs: Any = None,
           *, progress: ProgressFn | None = None, trace: str | Path | None = None,
           on_progress: Callable[[ProgressEvent], None] | None = None, **options: Any) -> ExportResult:
    """Export ``model`` (an nn.Module, ExportedProgram, ScriptModule or a model file path) to
    ``output_path`` in ``export_format``; see ExportOptions for the keyword options. ``progress``: called as
    ``(index, stage, status, seconds)`` when a stage ends; ``on_progress``: every ProgressEvent (a stage's
    start, its countable work, its end; see cann_export/progress.py), also logged to ``cann_export.progress``.

    Raises an ``ExportError`` subclass on bad input or a failed stage (nothing is left at
    ``output_path``). A parity failure is not raised: the artifact is written with the failure
    recorded and ``result.ok`` is False.
    ``trace``: a path for the stage timeline (Chrome trace JSON).
    """
    from . import progress as events

    if on_progress is not None:
        with events.listening(on_progress):
            return export(model, output_path, export_format, example_inputs, progress=progress, trace=trace,
                          **options)
    if trace is not None:  # every stage of every graph ("prefill:capture", ...) for a multi-graph bundle
        from .pipeline.timeline import StageTimeline

        progress = StageTimeline(trace).wrap(progress)
    check_options(export_format, options)
    with events.step(_first_read(model)) if _directory(model) else contextlib.nullcontext():
        several = graphs(model, options)  # transformers' import: seconds the live line names
    _check_decode_graph(model, several, options)
    if several is not None:  # a decoder with past / an encoder-decoder: one bundle of several graphs
        _check_defaulted(model, several, output_path, export_format, options)
        return export_multi(model, output_path, export_format=export_format, progress=progress,
                            known_task=several, **options)
    ctx = _context(model, Path(output_path), _options(export_format, dict(options)), example_inputs)
    _check_model_path(model)  # after the output's checks, before the sandbox child's torch import
    pipeline.run(ctx, progress)
    if ctx.halted:  # e.g. a DDP rank other than 0: it trained, rank 0 writes
        return ExportResult(ok=True, format=ctx.options.export_format, output="", files=[], onnx={}, parity=None,
                            manifest={"halted": ctx.halted})
    return _result(ctx)


def _check_decode_graph(model: Any, several: str | None, options: dict[str, Any]) -> None:
    """``decode_tokens`` sizes a decode graph: refused for an export that has none (one graph, a pipeline)."""
    from .diffusion.known_pipelines import TASK as PIPELINE_TASK

    tokens = options.get("decode_tokens", 1)
    if tokens != 1 and (several is None or several == PIPELINE_TASK):
        what = "a diffusers pipeline" if several else "one graph"
        name = model if isinstance(model, (str, Path)) else "the model"
        raise errors.OptionsError(f"--decode-tokens {tokens} sizes the decode graph of a decoder with past or an "
                                  f"encoder-decoder with past; {name} exports as {what}; drop --decode-tokens")


def _directory(model: Any) -> bool:
    return isinstance(model, (str, Path)) and Path(model).is_dir()


def _first_read(directory: Any) -> str:
    """The step that reads what a model directory is: a pipeline's model_index.json, else config.json."""
    from .diffusion.directory import is_pipeline_directory

    return "read model_index.json (the pipeline's parts)" if is_pipeline_directory(directory) \
        else "read config.json (task, graphs)"


def _check_model_path(model: Any) -> None:
    """A model path that does not exist is refused here, in the parent, before the sandbox child imports torch
    (the load stage's own check, seconds earlier)."""
    if isinstance(model, (str, Path)) and not Path(model).exists():
        raise errors.LoadError("model file not found; check the path", path=Path(model))


def check_options(export_format: str, options: dict[str, Any]) -> None:
    """Refuse a bad option value before anything heavy: ``graphs`` may import transformers (and torch) to ask a
    model directory's loader, seconds that a mistyped flag should not cost. Every ExportOptions check but
    ``dynamic``'s, whose values need only read in one of its two forms (``_check_dynamic_forms``); keywords
    that are not ExportOptions fields are left to the path that takes them."""
    known = {key: value for key, value in options.items()
             if key in _OPTION_FIELDS | {"tolerance", "atol", "rtol", "min_cosine"} and key != "dynamic"}
    opts = _options(export_format, known)
    opts.check(manager.registry().formats(), [e.name for e in manager.registry().exporters()])
    _check_dynamic_forms(options.get("dynamic"))


def _check_dynamic_forms(values: Any) -> None:
    """Each --dynamic value in one graph's form or a multi-graph bundle's ([COMPONENT:]DIM=...): which applies
    is known only once the model's loader is asked, so a value neither form reads is refused now, with the
    one-graph form's reason."""
    from .bundle.graph_ranges import parse_ranges
    from .dynamic import as_axes

    for value in values if isinstance(values, (list, tuple)) else [values] if values is not None else []:
        try:
            as_axes(value)
        except errors.OptionsError:
            if not isinstance(value, str):
                raise
            try:
                parse_ranges([value])
            except errors.OptionsError:
                as_axes(value)  # raises the one-graph form's message


def _check_defaulted(model: Any, task: str, output_path: str | Path, fmt: str, options: dict[str, Any]) -> None:
    """A file output (``-o model.onnx``) for a model whose *default* task exports several graphs (a causal LM's
    text-generation-with-past, Optimum's rule): refused naming the default and the --task that gives one file,
    since the same command wrote one graph before the default changed."""
    from .bundle.multi_write import component_format, one_file

    if options.get("task") is not None or options.get("kv_cache") or not task.endswith("-with-past") \
            or not Path(output_path).suffix or component_format(fmt) is None:  # check_request names other formats
        return
    base = task[: -len("-with-past")]
    one = (f"; pass --task {base} for one graph (no cache) in {Path(output_path).name}"
           if graphs(model, {**options, "task": base}) is None else "")
    if one_file(output_path):  # a single-file bundle held one graph before the default: the several need asking
        one += f", or --task {task} for its graphs in that one file"
    raise errors.OptionsError(f"with no --task, {model} exports as {task} (the -with-past form, as Optimum does, "
                              f"since config.json's use_cache is not false): several graphs, written as a bundle "
                              f"directory, not the file {Path(output_path).name}. Pass an output without a suffix "
                              f"for the bundle{one}", path=str(output_path))


def graphs(model: Any, options: dict[str, Any]) -> str | None:
    """Whether exporting ``model`` with export()'s keyword ``options`` gives several graphs, as the registered
    loaders declare it (their optional ``graphs``, highest priority first): the multi-graph task, ``"auto"``
    (the model decides which), or None for a single graph. ``kv_cache`` no loader claims still asks for several
    graphs (export_multi then says what it takes)."""
    from .diffusion.export import is_pipeline
    from .diffusion.known_pipelines import TASK as PIPELINE_TASK
    from .hooks.contracts import Loader

    if is_pipeline(model):  # a diffusers pipeline or its directory: one graph per component (diffusion/)
        return PIPELINE_TASK
    for loader in sorted(manager.registry().loaders().values(), key=lambda lo: -lo.priority):
        declared = optional(loader, Loader, "graphs")
        found = declared(model, dict(options)) if declared else None
        if found is not None:
            return str(found)
    return "auto" if options.get("kv_cache") else None


def export_multi(model: Any, output_path: str | Path, *, task: str | None = None, kv_cache: Any = None,
                 sequence_length: int = 7, progress: ProgressFn | None = None, **options: Any) -> Any:
    """Export a transformers decoder (``text-generation-with-past``) or encoder-decoder
    (``text2text-generation-with-past``, Whisper's ``automatic-speech-recognition-with-past``; without past:
    encoder + decoder) as the several graphs a deployment runs, never one ``If``-merged
    graph: ``prefill`` + ``decode`` (``kv_cache="static:N"``: a fixed window of N cache slots for ATC's
    static-shape path), or ``encoder`` + ``decoder`` + ``decoder_with_past``. One bundle directory:
    ``components/<name>/`` (each a complete bundle with its own parity verdict: atc_ready ones, with the device
    verdict, for ``export_format="atc_ready"``; onnx_bundle ones for ``"onnx"``), the top-level manifest
    (format, components, connections, overall verdict) and, for atc_ready, ``atc/convert.sh`` (one ATC command
    per graph).
    ``options``: export()'s keyword options, for every component. Returns a ``MultiResult``."""
    from .bundle.multi_write import check_request, export_plan
    from .diffusion.known_pipelines import TASK as PIPELINE_TASK
    from .hf.graph_plans import plan_for

    if (task or options.get("known_task")) == PIPELINE_TASK:  # a diffusers pipeline: planned in diffusion/
        from .diffusion.export import export_pipeline

        return export_pipeline(model, output_path, export, progress, options)
    options.pop("trust_remote_code", None)
    kv_cache = options.pop("kv_cache", None) if kv_cache is None else kv_cache
    task = options.pop("task", None) if task is None else task
    tokens = options.pop("decode_tokens", 1)
    carried: dict[str, bytes] = {}
    fmt = options.get("export_format", "atc_ready")
    check_request(task or "a decoder with past / encoder-decoder", fmt, Path(output_path), options)  # before loads
    from .bundle.graph_ranges import check_known_components, parse_ranges, split_hints

    parse_ranges(options.get("dynamic"))  # --dynamic DIM=LO..HI, [COMPONENT:]KEY=VALUE hints: refused before loads
    split_hints(options.get("atc_hints"))
    check_known_components(task or options.get("known_task"), options.get("dynamic"), options.get("atc_hints"))
    options.pop("known_task", None)
    if isinstance(model, (str, Path)):  # a model directory: loaded and exported in the load sandbox
        from .pipeline.sandboxed_directory import export_directory

        plan_for(None, task=task, kv_cache=kv_cache, check_only=True, decode_tokens=tokens)  # refused before the load
        return export_directory(Path(model), Path(output_path), export, (task, kv_cache, sequence_length, tokens),
                                progress, options)
    plan = plan_for(model, task=task, kv_cache=kv_cache, sequence_length=sequence_length, decode_tokens=tokens)
    return export_plan(plan, output_path, export, progress=progress, carried=carried, **options)


def _context(model: Any, output: Path, opts: ExportOptions, example_inputs: Any) -> ExportContext:
    """The options checked against the registries and the output checked replaceable, before any heavy work."""
    formats = manager.registry().formats()
    opts.check(formats, [e.name for e in manager.registry().exporters()])
    hint_warnings = atc_hints.resolve(opts)
    protect = tuple(p for p in (model if isinstance(model, (str, Path)) else None, opts.example_inputs_file,
                                opts.calibration_data) if p)
    atomic.check_target(output, opts.overwrite, protect)
    targets = optional(formats[opts.export_format], Format, "targets")
    for target in targets(output) if targets else [output]:
        atomic.check_target(target, opts.overwrite, protect)
    ctx = ExportContext(options=opts, source=model, output_path=output, explicit_inputs=example_inputs)
    ctx.format = formats[opts.export_format]
    ctx.reports.warnings.atc_hints = hint_warnings or None
    ctx.reports.warnings.soc = check_known_soc(opts.soc_version, opts.allow_unknown_soc)
    return ctx


def _result(ctx: ExportContext) -> ExportResult:
    from .bundle.manifest_build import summarize_parity

    parity = ctx.reports.parity.to_dict() if ctx.reports.parity is not None else None
    final_onnx = ctx.final_onnx or (
        (ctx.output_path / ctx.onnx_path.name) if ctx.format.is_directory else ctx.output_path)
    return ExportResult(
        ok=bool(parity["passed"]) if parity else True,
        format=ctx.options.export_format,
        output=str(ctx.output_path),
        files=[str(f) for f in ctx.files],
        onnx={"path": str(final_onnx), "opset": ctx.capture.opset, "exporter": ctx.capture.exporter,
              **({"specialized_to_traced_path": True} if ctx.capture.specialized else {})},
        parity=summarize_parity(parity) if parity else None,
        manifest=ctx.manifest,
        published=ctx.reports.publish,
        manifest_sha256=ctx.manifest_sha256,
        sandbox=ctx.reports.sandbox,
    )


@_api_spelling
@one_blas_thread
def validate(bundle: str | Path, tolerance: Tolerance | None = None, *, expect_sha256: str | None = None,
             soc_versions: list[str] | tuple[str, ...] | None = None, **tolerance_values: float) -> dict[str, Any]:
    """Re-derive a bundle's verdicts (a directory, a single-file bundle, or a file its format unpacks such as
    an om-stub); what is particular to the format is checked by the Format the manifest names.

    The file table, the graph against the manifest and the ATC command and cfg files (re-rendered from the
    validated ATC options) are checked, then parity is re-run from the stored inputs and reference outputs
    under the tool's policy (``Tolerance()``; ``tolerance`` or ``atol=`` / ``rtol=`` / ``min_cosine=``
    replace it explicitly), never under the tolerance the manifest records. Any difference between what the
    manifest claims and what was re-derived raises ``BundleMismatchError`` (exit 2) listing each one;
    ``expect_sha256`` pins the manifest's own sha256. A re-derived parity failure is returned, not raised.
    ``soc_versions``: also judge the bundle's device precision for each of these SoCs (their overflow modes),
    one verdict each in ``report["socs"]``; the overall ``passed`` is then theirs."""
    from .bundle import rederive
    from .bundle.read import manifest_sha256, open_bundle
    from .fs import digests

    explicit = tolerance is not None or any(v is not None for v in tolerance_values.values())
    unknown = sorted(set(tolerance_values) - {"atol", "rtol", "min_cosine"})
    if unknown:
        raise errors.OptionsError(f"unknown tolerance option(s) {', '.join(unknown)}; known: atol, rtol, min_cosine")
    tol = (tolerance or Tolerance()).with_values(**tolerance_values)
    tol.check()  # the checks and messages export's tolerance gets (finite, >= 0, a cosine in [-1, 1])
    from .options import check_soc_version

    socs = [check_soc_version(s) for s in ([soc_versions] if isinstance(soc_versions, str) else soc_versions or [])]
    if expect_sha256 is not None and not digests.is_sha256(expect_sha256.lower()):
        raise errors.OptionsError(f"--expect-sha256 {expect_sha256!r} is not 64 hex digits")
    path = Path(bundle)
    with open_bundle(path) as (directory, container):
        digest = manifest_sha256(directory)
        if expect_sha256 is not None and digest != expect_sha256.lower():
            raise errors.ValidateError(f"manifest.json has sha256 {digest}, not the expected {expect_sha256.lower()}; "
                                       "this is not the bundle that was pinned", path=path)
        from .bundle.multi_check import is_multi, validate_multi

        if container is None and is_multi(directory):  # several graphs: each component validated
            report = validate_multi(directory, path, validate, tolerance=tolerance, soc_versions=socs,
                                    **tolerance_values)
            report["bundle"] = str(bundle)
            return report
        checked = rederive.check_bundle(directory, container=container, raise_on_difference=False)
        try:
            report, parity_diffs = rederive.rederive_parity(checked, tol, explicit, socs)
        except errors.ExportError as e:
            if checked.differences:  # the parity data is unusable because the bundle was changed
                raise rederive.BundleMismatchError(checked.differences, path=path) from e
            raise
        except Exception as e:
            if not checked.differences:
                raise errors.ValidateError(f"parity could not run ({type(e).__name__}: {e})", path=path) from e
            report, parity_diffs = {}, []
        differences = checked.differences + parity_diffs
        if differences:
            raise rederive.BundleMismatchError(differences, path=path)
    report["bundle"] = str(bundle)
    report["manifest_sha256"] = digest
    return report


def inspect(path: str | Path) -> dict[str, Any]:
    """What a bundle or an .onnx file holds: inputs/outputs, opset, op histogram, metadata, parity, and
    what the bundle's Format adds (``describe``)."""
    from .bundle.inspect import describe
    from .bundle.multi_check import describe_multi, opened_multi

    with opened_multi(Path(path)) as directory:
        if directory is not None:
            return {**describe_multi(directory, inspect, Path(path)), "path": str(path)}
    return describe(Path(path))


def to_json(data: Any) -> str:
    """Strict RFC 8259 JSON of ``data``: what ``--json`` prints (see cann_export.fs.jsonio)."""
    from .fs.jsonio import dumps

    return dumps(data)
