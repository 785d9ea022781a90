"""``cann_export.load(BUNDLE)``: a pipeline bundle run back as the diffusers pipeline it came from. The bundle is
checked as validate checks it (file table, component manifests, connections, the pipeline section), then its
pipeline is rebuilt from the carried files (model_index.json's class, the scheduler's config, the tokenizers,
each part's config: no weights, nothing downloaded) with every model part an onnxruntime session on its graph.
Called like the pipeline: ``runner(prompt=..., generator=..., num_inference_steps=..., guidance_scale=...,
output_type="np").images``."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..errors import ExportError, OptionsError, gist
from .files import PIPELINE_DIR, read_json
from .parts import check_numbers
from .cache_spec import bundle_components, from_section
from .known_pipelines import KIND, PIPELINES, SCHEDULERS

REEXPORT = "re-export the bundle (cann-export PIPELINE_DIR)"


def load(bundle: str | Path, device: bool = False, cache: bool = True) -> Any:
    """The pipeline of the bundle at ``bundle`` (a directory or a single-file bundle) running its graphs in
    onnxruntime; ``device``: each graph under the device emulation its parity used instead of fp32; ``cache``: the
    denoiser applies the cache the bundle records (``pipeline.cache``, from insert_teacache), False: every step
    in full. Checked as ``cann_export.load`` checks every bundle (bundle/graph_runner.py)."""
    from ..bundle.graph_runner import load as load_bundle

    found = load_bundle(bundle, device=device, cache=cache)
    if not any(c.__name__ == "DiffusionPipeline" for c in type(found).__mro__):
        raise OptionsError(f"{bundle} is not a diffusers pipeline bundle (cann-export PIPELINE_DIR)", path=bundle)
    return found


def runner(directory: Path, manifest: dict[str, Any], path: Path, device: bool = False, cache: bool = True) -> Any:
    """The pipeline of the checked bundle ``directory`` (unpacked from ``path`` when a single file)."""
    if manifest.get("kind") != KIND:
        raise OptionsError(f"{path} is a {manifest.get('kind')} bundle; this runs a diffusers pipeline bundle",
                           path=path)
    # a single-file bundle's graphs outlive its unpacked copy: copied to a directory of the runner's own
    root = directory if directory == path else _copied(directory, Path(tempfile.mkdtemp(prefix="cann-runner-")))
    return build(root, manifest, device, cache)


def _copied(directory: Path, into: Path) -> Path:
    import shutil

    target = into / "bundle"
    shutil.copytree(directory, target)
    return target


def build(root: Path, manifest: dict[str, Any], device: bool = False, cache: bool = True) -> Any:
    import diffusers
    import transformers

    from .cached_denoiser import cached_denoiser
    from .end_to_end import device_runs, graph_path
    from .hosted import hosted_pipeline, ort_run, pipeline_flags
    from .sides import latent_limits

    cls = manifest["pipeline"]["class"]
    encoders, denoiser = PIPELINES[cls]
    spec = from_section(manifest["pipeline"].get("cache")) if cache else None
    names = bundle_components(cls, spec)
    index = read_json(root / PIPELINE_DIR / "model_index.json", "pipeline/model_index.json", REEXPORT)
    parts: dict[str, Any] = {}
    scheduler = index.get("scheduler")
    if not (isinstance(scheduler, list) and len(scheduler) == 2 and isinstance(scheduler[1], str)
            and scheduler[1] in SCHEDULERS):
        raise OptionsError("pipeline/model_index.json names no scheduler this tool knows", path=root)
    where = root / PIPELINE_DIR / "scheduler" / "scheduler_config.json"
    config = read_json(where, "scheduler_config.json", REEXPORT)
    check_numbers("scheduler", config, where, REEXPORT)
    parts["scheduler"] = _carried(where, getattr(diffusers, scheduler[1]).from_config, config)
    for enc in encoders:
        tok = enc.replace("text_encoder", "tokenizer")
        entry = index.get(tok)
        klass = entry[1] if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str) else None
        if klass not in ("CLIPTokenizer", "CLIPTokenizerFast", "T5Tokenizer", "T5TokenizerFast"):
            raise OptionsError(f"pipeline/model_index.json names no known tokenizer for {enc}", path=root)
        folder = root / PIPELINE_DIR / tok
        parts[tok] = _carried(folder, getattr(transformers, klass).from_pretrained, str(folder), local_files_only=True)
    configs = {n: _config(root, n) for n in (*encoders, denoiser, "vae")}
    runs = device_runs(root, names) if device else {n: ort_run(graph_path(root, n)) for n in names}
    cached = cached_denoiser(spec, denoiser, runs, configs[denoiser], parts["scheduler"]) if spec else None
    loop = (denoiser, "vae_decoder", *((spec.skip,) if spec else ()))  # the graphs the loop may call
    limits = latent_limits({n: _own(root, n) for n in loop})
    return hosted_pipeline(cls, parts, runs, configs, cached, limits, pipeline_flags(index))


def _carried(path: Path, build_part: Any, *args: Any, **kwargs: Any) -> Any:
    """``build_part(*args, **kwargs)``, a part rebuilt from the bundle's carried files, or an OptionsError naming
    ``path``."""
    try:
        return build_part(*args, **kwargs)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - diffusers' / transformers' refusal of a carried file
        raise OptionsError(f"the bundle's {path.name} cannot be rebuilt ({gist(e, 300)}); {REEXPORT}",
                           path=path) from e


def _own(root: Path, component: str) -> dict[str, Any]:
    """A component's manifest (already checked against the bundle's file table by check_multi)."""
    from ..bundle.multi_write import COMPONENTS_DIR

    return read_json(root / COMPONENTS_DIR / component / "manifest.json", f"{component}/manifest.json")


def _config(root: Path, part: str) -> Any:
    """A part's config with attribute access, as the pipeline reads it (``vae.config.scaling_factor``)."""
    from diffusers.configuration_utils import FrozenDict

    where = root / PIPELINE_DIR / part / "config.json"
    config = read_json(where, f"pipeline/{part}/config.json", REEXPORT)
    check_numbers(part, config, where, REEXPORT)
    return FrozenDict(config)
