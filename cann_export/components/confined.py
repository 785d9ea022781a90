"""A multi-graph export of a model directory, confined like a single-graph export from a file: the directory
is loaded and every graph exported in a forked child (``sandbox.child``: Landlock + seccomp) that may write
only inside one directory beside the output; the child sends back JSON, and this process checks that the
bundle lies in that directory, then renames it into place."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ExportError, OptionsError
from .bundle import MultiResult, place

DENIES = ["writes outside the export's staging directory", "execve", "sockets", "signals to other processes"]


def export_directory(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int], progress: Any,
                     options: dict[str, Any]) -> MultiResult:
    """Load ``path`` and export its graphs (``what``: task, kv_cache, sequence length) with ``export_one``
    (api.export) into ``output``; confined when the machine can (``sandbox`` option: auto, require, off)."""
    from ..sandbox import confine

    mode = options.get("sandbox", "auto")
    support = confine.probe() if mode != "off" else None
    why = "turned off (sandbox='off' / --no-sandbox)" if support is None else (
        None if support.available else "; ".join(support.missing))
    if why is not None:
        if mode == "require":
            raise OptionsError(f"--require-sandbox: the load cannot run sandboxed: {why}; drop --require-sandbox "
                               "or run where Landlock and seccomp are available", path=str(path))
        return _export(path, output, export_one, what, progress, {"kind": "none", "reason": why}, options)
    return _confined(path, output, export_one, what, progress, support, options)


def _export(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int], progress: Any,
            record: dict[str, Any], options: dict[str, Any], model_name: str | None = None) -> MultiResult:
    from .bundle import export_plan
    from .plan import plan_for
    from .source import load_directory

    from .. import progress as events

    task, kv_cache, length = what
    with events.step("load model directory"):
        model, found, carried = load_directory(path, task, options)
    with events.step("plan graphs"):
        plan = plan_for(model, task=found, kv_cache=kv_cache, sequence_length=length)
    return export_plan(plan, output, export_one, progress=progress, carried=carried, sandbox_record=record,
                       model_name=model_name, **options)


def _confined(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int], progress: Any,
              support: Any, options: dict[str, Any]) -> MultiResult:
    from ..fs import atomic
    from ..sandbox import child

    overwrite = bool(options.pop("overwrite", False))
    atomic.check_target(output, overwrite, (str(path),))
    record = {"kind": support.kind, "landlock_abi": support.landlock_abi, "denies": DENIES}
    box = atomic.staging_dir(output)
    try:
        (box / "tmp").mkdir()

        def body(send: Any) -> dict[str, Any]:
            atomic.stage_inside(box)
            os.environ["TMPDIR"] = tempfile.tempdir = str(box / "tmp")

            def forward(index: int, stage: str, status: str, seconds: float) -> None:
                send({"progress": [index, stage, status, seconds]})

            from .. import progress as events

            with events.listening(lambda event: send({"event": event.to_dict()})):  # to this process's view
                _export(path, box / "bundle", export_one, what, forward, record, options,
                        model_name=output.name.split(".")[0])
            return {}

        try:
            child.run(body, [box], support, _events(progress))
        except child.ChildFailed as e:
            raise ExportError(f"{e}. The model directory ran in the load sandbox ({support.kind}); nothing was "
                              "written. A crafted file, or a load that needs more memory than is free",
                              path=str(path), stage="load") from e
        result = _checked(box / "bundle", path, output)
        place(box / "bundle", output, overwrite)
    finally:
        atomic.discard(box)
    return result


def _events(progress: Any) -> Any:
    from ..sandbox import child

    def on_event(message: dict[str, Any]) -> None:
        if "event" in message:  # a stage's start, end or countable work (naming its graph), re-emitted here
            from .. import progress as events

            try:
                events.emit(events.ProgressEvent.from_dict(message["event"]))
            except ValueError as e:
                raise child.ChildFailed(f"the sandboxed child sent a malformed progress event ({e})") from e
            return
        event = message.get("progress")
        if not (isinstance(event, list) and len(event) == 4 and isinstance(event[0], int)):
            raise child.ChildFailed("the sandboxed child sent a malformed progress event")
        if progress:
            progress(event[0], str(event[1]), str(event[2]), float(event[3]))

    return on_event


def _checked(bundle: Path, path: Path, output: Path) -> MultiResult:
    """What the child wrote must be a plain directory that holds together before it moves into place; the
    result (verdict, components) comes from the checked manifests, never from the child's message."""
    from ..bundle.read import load_manifest_file
    from ..fs import digests
    from .bundle import component_summary, multi_ok
    from .check import check_multi

    if bundle.is_symlink() or not bundle.is_dir() or not (bundle / "manifest.json").is_file():
        raise ExportError("the sandboxed child wrote no bundle where it was told to", path=str(path), stage="write")
    manifest, diffs = check_multi(bundle)
    if diffs:
        raise ExportError("the sandboxed child's bundle does not match its manifest: " + "; ".join(diffs[:5]),
                          path=str(path), stage="write")
    components = {c["name"]: component_summary(load_manifest_file(bundle / c["path"] / "manifest.json"), c["name"])
                  for c in manifest["components"]}
    return MultiResult(ok=multi_ok(manifest), output=str(output), kind=manifest["kind"],
                       components=components, manifest=manifest,
                       manifest_sha256=digests.sha256_file(bundle / "manifest.json"),
                       format=str(manifest.get("format")))
