"""The stages of an export from a model file that run confined (``sandbox.child``): everything before
``commit``, in a forked child that may write only inside one directory beside the output. The child sends
back JSON only; here the staged artifact is checked to lie in that directory, then committed and published
by the caller's process as usual. ``plan`` decides, before any stage, what the manifest records."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import errors
from ..context import CaptureAttempt, CaptureReport, ExportContext, ParityReport
from ..fs import atomic
from ..hooks import manager
from ..hooks.contracts import Format, optional
from ..sandbox import child, confine
from . import rewind
from .stage import ProgressFn, Stage

FIRST_UNCONFINED = "commit"  # commit (the rename into place) and publish run in the caller's process
DENIES = ["writes outside the export's staging directory", "execve", "sockets", "signals to other processes"]


def _unconfinable(ctx: ExportContext) -> str | None:
    """Why this export from a file cannot run confined, or None."""
    if ctx.options.sandbox == "off":
        return "turned off (sandbox='off' / --no-sandbox)"
    dist = sys.modules.get("torch.distributed")
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if (world.isdigit() and int(world) > 1) or (dist is not None and dist.is_available() and dist.is_initialized()):
        return "a distributed run (torchrun / WORLD_SIZE > 1): its process group needs sockets"
    runs = optional(ctx.format, Format, "runs_programs")
    return runs(ctx.options) if runs else None


def plan(ctx: ExportContext) -> dict[str, Any]:
    """The sandbox record of this export (manifest.json's and --json's "sandbox"); raises OptionsError
    when the options require a sandbox (--require-sandbox) that cannot run."""
    if not isinstance(ctx.source, (str, Path)):
        return {"kind": "none", "reason": "the model is an in-memory object: the caller's own code, not a file"}
    why = _unconfinable(ctx)
    support = confine.probe() if why is None else None
    if support is not None and not support.available:
        why = "; ".join(support.missing)
    if why is not None:
        if ctx.options.sandbox == "require":
            raise errors.OptionsError(f"--require-sandbox: the load cannot run sandboxed: {why}. Run on Linux >= "
                                      "5.13 with Landlock enabled and libseccomp2 + pyseccomp installed, "
                                      "or drop --require-sandbox",
                                      path=str(ctx.source))
        return {"kind": "none", "reason": why}
    return {"kind": support.kind, "landlock_abi": support.landlock_abi, "denies": DENIES,
            "torch_threads": "all" if child.fork_keeps_threads() else 1}


def run_confined(ctx: ExportContext, stages: tuple[Stage, ...], progress: ProgressFn | None, run_one: Any) -> int:
    """Run the stages before ``commit`` in a confined child (``run_one`` runs one, as in-process); return
    the index of the first stage left to run here."""
    names = [s.name for s in stages]
    split = names.index(FIRST_UNCONFINED) if FIRST_UNCONFINED in names else len(stages)
    box = ctx.sandbox_dir = atomic.staging_dir(ctx.output_path)
    (box / "tmp").mkdir()
    registry = manager.registry()
    reached = [0]

    def body(send: child.Send) -> dict[str, Any]:
        atomic.stage_inside(box)
        os.environ["TMPDIR"] = tempfile.tempdir = str(box / "tmp")
        _quiet_onnxruntime()

        def forward(index: int, stage: str, status: str, seconds: float) -> None:
            send({"progress": [index, stage, status, seconds]})

        from .. import progress as events

        with events.listening(lambda event: send({"event": event.to_dict()})):
            for index, stage in rewind.in_order(ctx, stages, 0, split):
                if ctx.halted:
                    break
                run_one(ctx, stage, registry, forward, index + 1, len(stages))
        if split < len(stages) and not ctx.halted:
            _finalize(ctx)
        return _outcome(ctx)

    def on_event(message: dict[str, Any]) -> None:
        index = relay(message, progress)
        if index is not None:
            reached[0] = index

    keep_threads = child.fork_keeps_threads()
    _import_what_commit_reads(ctx)
    try:
        data = child.run(body, [box], confine.probe(), on_event, keep_threads)
        _apply(ctx, data, box)
    except child.ChildFailed as e:
        stage = stages[min(reached[0], len(stages) - 1)]
        raise stage.error(f"{e}. The model file ran in the load sandbox ({ctx.reports.sandbox['kind']}); nothing "
                          "was written. A crafted file, or a load that needs more memory than is free",
                          path=str(ctx.source), stage=stage.name) from e
    return split


def _import_what_commit_reads(ctx: ExportContext) -> None:
    """The libraries this process's check of the staged artifact reads it with (``write_stage.check_staged``: onnx for
    the graph, torch for a program's operators), imported before the fork: the child needs them as well and inherits
    them, so no process imports them twice (0.6 CPU-s of any export's fixed cost, 3 of an atc_ready one's)."""
    import onnx  # noqa: F401

    if getattr(ctx.format, "writes_program", False):
        from ..load.program_graph import import_libraries

        import_libraries()


def _quiet_onnxruntime() -> None:
    """onnxruntime's environment warns on stderr, past any session's log level, that it cannot persist its
    telemetry id (a write the sandbox denies): errors only, before its first session in the child."""
    try:
        import onnxruntime
    except ImportError:
        return
    onnxruntime.set_default_logger_severity(3)


def _finalize(ctx: ExportContext) -> None:
    """The format's finalize (the manifest records the verdict), in the child, as the commit stage does."""
    try:
        ctx.format.finalize(ctx, ctx.staging)
    except errors.ExportError:
        raise
    except Exception as e:
        raise errors.WriteError(f"{type(e).__name__}: {errors.gist(e, 600)}", path=str(ctx.source),
                                stage=FIRST_UNCONFINED) from e
    ctx.finalized = True


def _outcome(ctx: ExportContext) -> dict[str, Any]:
    """What the caller's process needs of the child's context, as JSON."""
    parity = ctx.reports.parity
    return {"halted": ctx.halted, "finalized": ctx.finalized,
            "staging": str(ctx.staging) if ctx.staging else None, "output_name": ctx.output_path.name,
            "onnx_name": ctx.onnx_path.name if ctx.onnx_path else None,
            "final_onnx": str(ctx.final_onnx) if ctx.final_onnx else None,
            "manifest": ctx.manifest, "parity": parity.to_dict() if parity is not None else None,
            "capture": ctx.capture.to_dict() if ctx.capture is not None else None,
            "metadata": dict(ctx.metadata), "stage_seconds": dict(ctx.stage_seconds)}


def _apply(ctx: ExportContext, data: dict[str, Any], box: Path) -> None:
    """The child's outcome onto this process's context; the staging it names must be a plain directory
    directly inside ``box`` (the only place the child could write)."""
    try:
        staging = data.get("staging")
        if staging is not None:
            path = Path(str(staging))
            if path.parent != box or path.is_symlink() or not path.is_dir():
                raise child.ChildFailed("the sandboxed child named a staging directory outside its own")
            ctx.staging = path
        if data.get("output_name") not in (None, ctx.output_path.name):  # the format added its suffix
            ctx.output_path = _declared_target(ctx, str(data["output_name"]))
        if data.get("onnx_name"):
            ctx.onnx_path = (ctx.staging or box) / Path(str(data["onnx_name"])).name
        ctx.final_onnx = str(data["final_onnx"]) if data.get("final_onnx") else None
        ctx.manifest = dict(data.get("manifest") or {})
        if data.get("parity") is not None:
            ctx.reports.parity = ParityReport.from_dict(data["parity"])
        if data.get("capture") is not None:
            capture = dict(data["capture"])
            capture["attempts"] = [CaptureAttempt(**a) for a in capture.get("attempts", [])]
            ctx.capture = CaptureReport(**capture)
        ctx.metadata = {str(k): str(v) for k, v in dict(data.get("metadata") or {}).items()}
        ctx.stage_seconds.update({str(k): float(v) for k, v in dict(data.get("stage_seconds") or {}).items()})
        ctx.finalized = bool(data.get("finalized"))
        ctx.halted = str(data["halted"]) if data.get("halted") else None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise child.ChildFailed(f"the sandboxed child sent an outcome that does not fit ({type(e).__name__})") from e


def _declared_target(ctx: ExportContext, name: str) -> Path:
    """The output the child's format chose, when it is one of the format's declared targets of the output
    the user asked for (checked replaceable before any work); the child never picks where a rename goes."""
    targets = optional(ctx.format, Format, "targets")
    for target in targets(ctx.output_path) if targets else []:
        if Path(target).name == name and Path(target).parent == ctx.output_path.parent:
            return Path(target)
    raise child.ChildFailed(f"the sandboxed child named an output {name[:80]!r} its format does not declare")


def cleanup(ctx: ExportContext) -> None:
    atomic.discard(ctx.sandbox_dir)


def relay(message: dict[str, Any], progress: ProgressFn | None) -> int | None:
    """Re-emit one progress message of the sandboxed child here (a stage's start, end or countable work; or a
    stage's end for ``progress``); the index of the stage that ended, None for an event. A malformed message
    fails the child's run."""
    from ..sandbox import child

    if "event" in message:
        from .. import progress as events

        try:
            events.emit(events.ProgressEvent.from_dict(message["event"]))
        except ValueError as e:
            raise child.ChildFailed(f"the sandboxed child sent a malformed progress event ({e})") from e
        return None
    event = message.get("progress")
    if not (isinstance(event, list) and len(event) == 4 and isinstance(event[0], int)):
        raise child.ChildFailed("the sandboxed child sent a malformed progress event")
    if progress:
        progress(event[0], str(event[1]), str(event[2]), float(event[3]))
    return event[0]
