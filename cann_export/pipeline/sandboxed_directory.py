"""A multi-graph export of a model directory, confined like a single-graph export from a file: the directory
is loaded and every graph exported in a forked child (``sandbox.child``: Landlock + seccomp) that may write
only inside one directory beside the output; the child sends back JSON, and this process checks the bundle it
staged in that directory (``multi_check.check_multi``, then ``staged_multi_problems``: the rule a single graph's
staging is checked by before commit), then renames it into place. Unconfined (--no-sandbox, no sandbox here), the
bundle is staged and checked the same way, in this process."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ExportError, OptionsError
from ..bundle.multi_write import MultiResult, place
from .sandboxed_file import DENIES, relay


def export_directory(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int, int], progress: Any,
                     options: dict[str, Any], planner: Any = None) -> MultiResult:
    """Load ``path`` and export its graphs (``what``: task, kv_cache, sequence length, decode tokens) with
    ``export_one`` (api.export) into ``output``; confined when the machine can (``sandbox`` option: auto, require, off).
    ``planner``: ``(path, options) -> (plan, carried files)`` for a directory of another kind (a diffusers
    pipeline: diffusion/export.py), loaded and planned in the same sandbox."""
    if planner is not None:
        options = {**options, "_planner": planner}
    from ..sandbox import confine

    mode = options.get("sandbox", "auto")
    support = confine.probe() if mode != "off" else None
    why = "turned off (sandbox='off' / --no-sandbox)" if support is None else (
        None if support.available else "; ".join(support.missing))
    if why is not None:
        if mode == "require":
            raise OptionsError(f"--require-sandbox: the load cannot run sandboxed: {why}; drop --require-sandbox "
                               "or run where Landlock and seccomp are available", path=str(path))
        return _confined(path, output, export_one, what, progress, None, options, why)
    return _confined(path, output, export_one, what, progress, support, options)


def _export(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int, int], progress: Any,
            record: dict[str, Any], options: dict[str, Any], model_name: str | None = None) -> MultiResult:
    from ..bundle.multi_write import export_plan
    from ..hf.graph_plans import plan_for
    from ..hf.directory_source import load_directory

    from .. import progress as events

    task, kv_cache, length, tokens = what
    planner = options.pop("_planner", None)
    if planner is not None:
        with events.step("load and plan the pipeline directory"):
            plan, carried = planner(path, options)
        return export_plan(plan, output, export_one, progress=progress, carried=carried, sandbox_record=record,
                           model_name=model_name, **options)
    with events.step("load model directory"):
        model, found, carried = load_directory(path, task, options)
    with events.step("plan graphs"):
        plan = plan_for(model, task=found, kv_cache=kv_cache, sequence_length=length, decode_tokens=tokens)
    return export_plan(plan, output, export_one, progress=progress, carried=carried, sandbox_record=record,
                       model_name=model_name, **options)


def _confined(path: Path, output: Path, export_one: Any, what: tuple[str | None, Any, int, int], progress: Any,
              support: Any, options: dict[str, Any], why: str | None = None) -> MultiResult:
    """Stage the bundle in a directory beside ``output`` (in the confined child unless ``support`` is None:
    then here, unconfined, for ``why``), check it, rename it into place."""
    from ..fs import atomic
    from ..sandbox import child

    overwrite = bool(options.pop("overwrite", False))
    atomic.check_target(output, overwrite, (str(path),))
    box = atomic.staging_dir(output)
    try:
        if support is None:
            _export(path, box / "bundle", export_one, what, progress, {"kind": "none", "reason": why}, options)
            result = _checked(box / "bundle", path, output, "the stages before commit")
            place(box / "bundle", output, overwrite)
            return result
        record = {"kind": support.kind, "landlock_abi": support.landlock_abi, "denies": DENIES}
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

        keep_threads = child.fork_keeps_threads()
        import onnx  # noqa: F401 - _checked reads every graph with it: imported once, before the fork, for both

        try:
            child.run(body, [box], support, _events(progress), keep_threads)
        except child.ChildFailed as e:
            raise ExportError(f"{e}. The model directory ran in the load sandbox ({support.kind}); nothing was "
                              "written. A crafted file, or a load that needs more memory than is free",
                              path=str(path), stage="load") from e
        from .. import collector

        collector.settle()  # the child exported: this process's collector back on (collector.py)
        result = _checked(box / "bundle", path, output, f"the sandboxed stages ({support.kind})")
        place(box / "bundle", output, overwrite)
    finally:
        atomic.discard(box)
    return result


def _events(progress: Any) -> Any:
    """The child's progress messages, re-emitted here (each names its graph)."""
    def on_event(message: dict[str, Any]) -> None:
        relay(message, progress)

    return on_event


def _checked(bundle: Path, path: Path, output: Path, where: str) -> MultiResult:
    """What the child (``where``: who staged it) wrote must be a plain directory that holds together and is what
    the format writes before it moves into place; the result (verdict, components) comes from the checked
    manifests, never from the child's message."""
    from ..bundle.read import load_manifest_file
    from ..fs import digests
    from ..bundle.multi_write import component_summary, multi_ok
    from ..bundle.multi_check import check_multi

    if bundle.is_symlink() or not bundle.is_dir() or not (bundle / "manifest.json").is_file():
        raise ExportError(f"{where} wrote no bundle where they were told to", path=str(path), stage="write")
    with digests.remembered():  # a component's files are in the top-level table and in the component's
        manifest, diffs = check_multi(bundle)
        if diffs:
            raise ExportError(f"{where} staged a bundle that does not match its manifest: " + "; ".join(diffs[:5]),
                              path=str(path), stage="write")
        staged = staged_multi_problems(bundle, manifest)
    if staged:
        shown = "; ".join(staged[:8]) + (f"; ... {len(staged) - 8} more" if len(staged) > 8 else "")
        raise ExportError(f"{where} staged what a --format {str(manifest.get('format'))[:40]} multi-graph bundle does "
                          f"not hold: {shown}. Nothing was committed. The model's code (a trusted pickle, "
                          "--trust-remote-code, a crafted file) wrote into the export; do not use this model",
                          path=str(path), stage="commit")
    components = {c["name"]: component_summary(load_manifest_file(bundle / c["path"] / "manifest.json"), c["name"])
                  for c in manifest["components"]}
    return MultiResult(ok=multi_ok(manifest), output=str(output), kind=manifest["kind"],
                       components=components, manifest=manifest,
                       manifest_sha256=digests.sha256_file(bundle / "manifest.json"),
                       format=str(manifest.get("format")))


def staged_multi_problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """What a multi-graph export staged, under the rule a single graph's staging is checked by before commit
    (``bundle/staged.py``): no link or special file anywhere; at the top only manifest.json, the ATC script (when
    the components are headed for ATC), the carried ``hf/`` files and the listed components; the top-level file
    table lists exactly the files; and each component is what its format writes (its own file table, convert.sh
    and cfg files re-rendered from its validated ATC options, its manifest's strict schema)."""
    from ..bundle.staged import MANIFEST, carried_names, shown, staged_problems, walk
    from ..bundle.multi_write import COMPONENTS_DIR, CONVERT, atc_headed, component_format

    inner = component_format(manifest.get("format"))
    files, folders, problems = walk(directory)
    homes = [c["path"] for c in manifest["components"]]
    from ..plan import carried_file

    top = {MANIFEST, *carried_names(), *([CONVERT] if atc_headed(inner) else [])}
    top |= {rel for rel in manifest["files"] if carried_file(manifest.get("kind"), rel)}  # a pipeline's files
    for rel in files:
        if rel not in top and not any(rel.startswith(f"{home}/") for home in homes):
            problems.append(f"{shown(rel)}: not a file a multi-graph bundle holds")
        elif rel != MANIFEST and rel not in manifest["files"]:
            problems.append(f"{shown(rel)}: not in the top-level file table of manifest.json")
    known = {COMPONENTS_DIR, *homes, *("/".join(p.split("/")[:k]) for p in top for k in range(1, p.count("/") + 1))}
    problems += [f"{shown(rel)}/: not a directory a multi-graph bundle holds" for rel in folders
                 if rel not in known and not any(rel.startswith(f"{home}/") for home in homes)]
    if inner is None:
        return problems  # format_problems names it
    for home in homes:
        if (directory / home).is_dir() and not (directory / home).is_symlink():
            _, own = staged_problems(directory / home, inner, directory / home)
            problems += [f"{home}: {problem}" for problem in own]
    return problems
