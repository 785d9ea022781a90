"""Exporting a diffusers pipeline (in memory, or a pipeline directory loaded in the load sandbox) as one
multi-graph bundle: the plan's components written by the multi-graph writer, the pipeline's files under
``pipeline/``, and the ``pipeline`` section (class, scheduler, tokenizers, configs, the end-to-end check)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ExportError, LoadError, gist
from .files import MODEL_INDEX, PIPELINE_DIR, pipeline_files


def is_pipeline(model: Any) -> bool:
    """A diffusers pipeline object, or a directory with model_index.json."""
    from .directory import is_pipeline_directory

    if isinstance(model, (str, Path)):
        return is_pipeline_directory(model)
    return any(c.__name__ == "DiffusionPipeline" for c in type(model).__mro__)


def section(pipe: Any, files: dict[str, bytes], end_to_end: dict[str, Any] | None,
            warnings: list[str] | None = None, cache: Any = None) -> dict[str, Any]:
    """The manifest's ``pipeline`` section: what the runner rebuilds the pipeline from, the end-to-end check
    (None: --no-validate), and the denoiser's cache (cache_spec.CacheSpec, when insert_teacache asked one)."""
    from .planner import pipeline_class

    by_part: dict[str, list[str]] = {}
    for rel in sorted(files):
        parts = rel.split("/")
        if len(parts) == 3:
            by_part.setdefault(parts[1], []).append(rel)
    return {"class": pipeline_class(pipe), "model_index": f"{PIPELINE_DIR}/{MODEL_INDEX}",
            "scheduler": type(pipe.scheduler).__name__, "parts": by_part, "end_to_end": end_to_end,
            "warnings": list(warnings or []), **({"cache": cache.section()} if cache is not None else {})}


def planned(pipe: Any, model_index: bytes | None, options: dict[str, Any],
            directory: Path | None = None) -> tuple[Any, dict[str, bytes]]:
    """The plan of ``pipe`` with its finishing step (the end-to-end check, unless not validating) and the files
    it carries; ``options["atc_hints"]`` become the components' own (``hints.pipeline_hints``), in place.
    ``directory``: where ``pipe`` was loaded from (its failure to run while planned is named with it)."""
    import warnings

    from .cache_measure import with_measure
    from .end_to_end import check
    from .component_hints import pipeline_hints
    from .planner import pipeline_plan
    from .sides import check_asked

    validate = options.get("validate", True) is not False
    cache, hints = _cache_asked(pipe, options.get("atc_hints"))
    options["atc_hints"], said = pipeline_hints(pipe, hints)
    for text in said:
        warnings.warn(text, stacklevel=2)
    check_asked(pipe, options.get("dynamic"))
    try:
        plan = pipeline_plan(pipe, cache)  # runs the pipeline's parts on its example
    except (ExportError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a loaded directory's parts that do not run together
        if directory is None:
            raise
        raise LoadError(f"the pipeline loaded from the directory fails when its parts run on the example "
                        f"({gist(e, 300)}); if its configs or tokenizer files were edited, restore them from the "
                        "model's snapshot or re-save the pipeline with pipe.save_pretrained(DIR)",
                        path=directory) from e
    files = pipeline_files(pipe, model_index)

    def finish(staging: Path, results: dict[str, Any]) -> dict[str, Any]:
        from .. import progress as events
        from .e2e_images import write_images
        from .source_weights import carries_weights, write_weights

        images: dict[str, Any] = {}
        with events.step("end-to-end check (diffusers loop, onnxruntime)"):
            result = check(pipe, staging, images) if validate else None
        if result is not None and cache is not None:
            with events.step("cache measure (cache off, and at the recorded setting)"):
                result = with_measure(result, pipe, staging, cache)
        if result is not None:
            result["images"] = write_images(images, staging)
        written = list((result or {}).get("images", {}).values())
        if carries_weights(str(options.get("export_format") or "atc_ready")):
            with events.step("the source weights (safetensors, for load_model framework='pytorch')"):
                written += write_weights(pipe, staging)
        return {"pipeline": section(pipe, {**files, **dict.fromkeys(written, b"")}, result, said, cache)}

    plan.finish = finish
    return plan, files


def _cache_asked(pipe: Any, hints: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """(the cache ``insert_teacache`` asks, or None; the other hints, with the entries naming another pipeline's
    denoiser left for component_hints' warning)."""
    from .cache_spec import HINT, INTERVAL, THRESHOLD, cache_spec

    cache, elsewhere = cache_spec(pipe, hints)
    rest = {k: v for k, v in (hints or {}).items() if k not in (HINT, THRESHOLD, INTERVAL)}
    return cache, {**rest, HINT: elsewhere} if elsewhere else rest


def export_pipeline(model: Any, output: str | Path, export_one: Any, progress: Any, options: dict[str, Any]) -> Any:
    """Export ``model`` (a pipeline or a pipeline directory) with ``export_one`` (api.export) into ``output``."""
    from ..bundle.multi_write import check_request, export_plan

    if isinstance(model, (str, Path)):
        from .directory import read_index

        read_index(Path(model))  # what the directory is, named before the options that depend on it
    fmt = options.get("export_format", "atc_ready")
    check_request("a diffusers pipeline", fmt, Path(output), options)
    if options.pop("trust_remote_code", None):
        import warnings

        warnings.warn("trust_remote_code is ignored for a diffusers pipeline: only diffusers' and transformers' own "
                      "classes are loaded (model_index.json naming any other is refused)", stacklevel=2)
    options.pop("task", None)
    options.pop("known_task", None)
    if isinstance(model, (str, Path)):
        from ..pipeline.sandboxed_directory import export_directory

        def plan_directory(path: Path, given: dict[str, Any]) -> tuple[Any, dict[str, bytes]]:
            from .directory import load_pipeline

            pipe, index = load_pipeline(path)
            return planned(pipe, index, given, directory=path)

        return export_directory(Path(model), Path(output), export_one, (None, None, 0, 1), progress, options,
                                planner=plan_directory)
    with on_cpu(model):
        plan, files = planned(model, None, options)
        return export_plan(plan, output, export_one, progress=progress, carried=files, **options)


@contextlib.contextmanager
def on_cpu(pipe: Any) -> Iterator[None]:
    """``pipe`` on the CPU (export computes there) and back where it was afterwards (npu, npu-sim, cuda)."""
    import torch

    devices = {p.device for part in pipe.components.values() if isinstance(part, torch.nn.Module)
               for p in part.parameters()}
    try:
        pipe.to("cpu")
    except Exception as e:  # noqa: BLE001 - a part diffusers cannot move: not the module the pipeline expects
        raise LoadError(f"diffusers cannot move the pipeline to the CPU, where it is exported ({gist(e, 300)}); each "
                        f"part must be the diffusers / transformers module {type(pipe).__name__} expects, on one "
                        "device (no device_map)") from e
    try:
        yield
    finally:
        if len(devices) == 1 and next(iter(devices)).type != "cpu":
            pipe.to(next(iter(devices)))
