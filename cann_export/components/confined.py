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
from .bundle import MultiResult

DENIES = ["writes outside the export's staging directory", "execve", "sockets", "signals to other processes"]


def export_directory(path: Path, output: Path, task: str | None, kv_cache: Any, sequence_length: int,
                     progress: Any, options: dict[str, Any]) -> MultiResult:
    """Load ``path`` and export its graphs into ``output``; confined when the machine can (``sandbox``
    option: "auto", "require" or "off")."""
    from ..sandbox import child, confine
    from .bundle import export_plan
    from .plan import plan_for
    from .source import load_directory

    mode = options.get("sandbox", "auto")
    support = confine.probe() if mode != "off" else None
    why = "turned off (sandbox='off' / --no-sandbox)" if support is None else (
        None if support.available else "; ".join(support.missing))
    if why is not None:
        if mode == "require":
            raise OptionsError(f"--require-sandbox: the load cannot run sandboxed: {why}; drop --require-sandbox "
                               "or run where Landlock and seccomp are available", path=str(path))
        model, task, carried = load_directory(path, task, options)
        plan = plan_for(model, task=task, kv_cache=kv_cache, sequence_length=sequence_length)
        return export_plan(plan, output, progress=progress, carried=carried,
                           sandbox_record={"kind": "none", "reason": why}, **options)
    from ..fs import atomic, digests

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

            model, found, carried = load_directory(path, task, options)
            plan = plan_for(model, task=found, kv_cache=kv_cache, sequence_length=sequence_length)
            result = export_plan(plan, box / "bundle", progress=forward, carried=carried, sandbox_record=record,
                                 **options)
            return {"ok": result.ok, "kind": result.kind, "components": result.components}

        def on_event(message: dict[str, Any]) -> None:
            event = message.get("progress")
            if not (isinstance(event, list) and len(event) == 4 and isinstance(event[0], int)):
                raise child.ChildFailed("the sandboxed child sent a malformed progress event")
            if progress:
                progress(event[0], str(event[1]), str(event[2]), float(event[3]))

        try:
            data = child.run(body, [box], support, on_event)
        except child.ChildFailed as e:
            raise ExportError(f"{e}. The model directory ran in the load sandbox ({support.kind}); nothing was "
                              "written. A crafted file, or a load that needs more memory than is free",
                              path=str(path), stage="load") from e
        bundle = box / "bundle"
        if bundle.is_symlink() or not bundle.is_dir() or not (bundle / "manifest.json").is_file():
            raise ExportError("the sandboxed child wrote no bundle where it was told to", path=str(path),
                              stage="write")
        from .check import check_multi

        manifest, diffs = check_multi(bundle)  # what the child wrote must hold together before it moves
        if diffs:
            raise ExportError("the sandboxed child's bundle does not match its manifest: " + "; ".join(diffs[:5]),
                              path=str(path), stage="write")
        digest = digests.sha256_file(bundle / "manifest.json")
        atomic.commit_dir(bundle, output, overwrite)
    finally:
        atomic.discard(box)
    return MultiResult(ok=bool(data.get("ok")), output=str(output), kind=manifest["kind"],
                       components=dict(data.get("components") or {}), manifest=manifest, manifest_sha256=digest)
