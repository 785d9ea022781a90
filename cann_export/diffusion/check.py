"""validate's re-derivation of a pipeline bundle's own parts (the multi-graph checker calls it for the
``diffusion-pipeline`` kind): the components and roles of its pipeline class (``table``), the connections from
its text encoders' output names (``plan.wiring``), the run notes, and the ``pipeline`` section: its class, the
carried files it names exactly those under ``pipeline/`` in the file table, each an allowed name, and the
end-to-end verdict consistent with its own numbers."""
from __future__ import annotations

from typing import Any

from .cache_spec import bundle_components
from .files import IMAGE_FILE, MODEL_INDEX, PIPELINE_DIR, allowed
from .known_pipelines import PIPELINES, components_of

SECTION_KEYS = ("class", "model_index", "scheduler", "parts", "end_to_end", "warnings", "cache")


def carried_file(rel: str) -> bool:
    """Whether ``rel`` is a pipeline file (pipeline/: model_index.json, a part's configs, tokenizer files) a
    pipeline bundle may carry beside its graphs (plan.carried_file)."""
    return allowed(rel)


def wiring_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]]) -> list[str]:
    from .planner import run_notes, wiring

    run = manifest.get("run") if isinstance(manifest.get("run"), dict) else {}
    cls = run.get("pipeline")
    if cls not in PIPELINES:
        return [f"manifest.json run.pipeline: {str(cls)[:80]!r} is not one of {', '.join(PIPELINES)}"]
    cache, problem = recorded_cache(manifest)
    if problem:
        return [problem]
    names = list(bundle_components(cls, cache))
    recorded = [(c["name"], c.get("role")) for c in manifest["components"]]
    if recorded != [(n, n) for n in names]:
        return [f"manifest.json components: {[n for n, _ in recorded]} are not those of a {cls} bundle "
                f"({', '.join(names)}, each its own role)"]
    encoders, _ = PIPELINES[cls]
    outputs = {e: [v["name"] for v in owns[e]["model"]["outputs"]] for e in encoders}
    expected = sorted(wiring(cls, outputs, cache))
    actual = sorted((c["from"]["component"], c["from"]["output"], c["to"]["component"], c["to"]["input"])
                    for c in manifest["connections"])
    problems = []
    if actual != expected:
        problems.append(f"manifest.json connections: not the {len(expected)} of a {cls} bundle's graphs")
    if run != run_notes(cls):
        problems.append(f"manifest.json run: not the run notes of a {cls} bundle")
    return problems + section_problems(manifest, cls) + not_emulated_problems(manifest, owns, cls)


def not_emulated_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]], cls: str) -> list[str]:
    """The end-to-end device loop ran in fp32 exactly the components whose own manifests say their device emulation
    was skipped (large graphs; validate checks each such claim against its external data). A bundle exported
    before the loop recorded them (it emulated every component) has no ``not_emulated``."""
    e2e = (manifest.get("pipeline") or {}).get("end_to_end")
    device = e2e.get("device") if isinstance(e2e, dict) else None
    if not isinstance(device, dict) or "not_emulated" not in device:
        return []
    from .end_to_end import skipped_in

    skipped = sorted(skipped_in({n: owns.get(n) for n in components_of(cls)}))
    said = device["not_emulated"]
    if not isinstance(said, dict) or sorted(said) != skipped:
        return ["manifest.json pipeline.end_to_end.device.not_emulated: not the components whose device emulation "
                f"was skipped ({', '.join(skipped) or 'none'})"]
    return []


def recorded_cache(manifest: dict[str, Any]) -> tuple[Any, str | None]:
    """(the cache_spec.CacheSpec ``pipeline.cache`` records, or None; a problem with the section, or None)."""
    from .cache_spec import from_section

    section = (manifest.get("pipeline") or {}).get("cache") if isinstance(manifest.get("pipeline"), dict) else None
    if section is None:
        return None, None
    try:
        cache = from_section(section)
    except (KeyError, TypeError, ValueError):
        return None, "manifest.json pipeline.cache: not a cache section (component, module, range, policy)"
    if cache is None or cache.section() != section:
        return None, "manifest.json pipeline.cache: not the section its own range and policy give"
    return cache, None


def section_problems(manifest: dict[str, Any], cls: str) -> list[str]:
    section = manifest.get("pipeline")
    if not isinstance(section, dict):
        return ["manifest.json pipeline: missing (a pipeline bundle records its pipeline section)"]
    problems = [f"manifest.json pipeline.{k[:40]}: not a field of the pipeline section"
                for k in section if k not in SECTION_KEYS]
    if section.get("class") != cls:
        problems.append(f"manifest.json pipeline.class: not {cls} (run.pipeline)")
    if section.get("model_index") != f"{PIPELINE_DIR}/{MODEL_INDEX}":
        problems.append(f"manifest.json pipeline.model_index: not {PIPELINE_DIR}/{MODEL_INDEX}")
    carried = sorted(rel for rel in manifest["files"] if rel.startswith(f"{PIPELINE_DIR}/"))
    named = section.get("parts") if isinstance(section.get("parts"), dict) else {}
    listed = sorted([f"{PIPELINE_DIR}/{MODEL_INDEX}"] + [r for rels in named.values() if isinstance(rels, list)
                                                         for r in rels if isinstance(r, str)])
    if carried != listed:
        problems.append("manifest.json pipeline.parts: not the pipeline/ files of the file table")
    problems += [f"manifest.json files[{rel[:120]!r}]: not a pipeline file a bundle carries (refused)"
                 for rel in carried if not allowed(rel)][:5]
    problems += end_to_end_problems(section.get("end_to_end"))
    images = (section.get("end_to_end") or {}).get("images") if isinstance(section.get("end_to_end"), dict) else None
    if images is not None and not (isinstance(images, dict) and all(
            isinstance(rel, str) and IMAGE_FILE.fullmatch(rel.removeprefix(f"{PIPELINE_DIR}/")) and rel in carried
            for rel in images.values())):
        problems.append("manifest.json pipeline.end_to_end.images: not the end-to-end images of the file table")
    return problems


def end_to_end_problems(e2e: Any) -> list[str]:
    """The recorded verdicts follow from the recorded numbers under the tool's bars (end_to_end's constants)."""
    from .end_to_end import LATENT_ATOL, LATENT_RTOL, MAX_COSINE_DISTANCE

    if e2e is None:
        return []  # exported with --no-validate
    where = "manifest.json pipeline.end_to_end"
    if not isinstance(e2e, dict) or not all(isinstance(e2e.get(k), dict) for k in ("fp32", "device")):
        return [f"{where}: not an object with fp32 and device"]
    fp32, device = e2e["fp32"], e2e["device"]
    problems = []
    if fp32.get("tolerance") != {"atol": LATENT_ATOL, "rtol": LATENT_RTOL}:
        problems.append(f"{where}.fp32.tolerance: not the tool's (atol {LATENT_ATOL}, rtol {LATENT_RTOL})")
    before = device.get("before_fix")  # the device loop rerun without --fix-precision's keep sets
    for key, entry in (("device", device), ("device.before_fix", before)):
        if entry is not None and not isinstance(entry, dict):
            problems.append(f"{where}.{key}: not an object")
        elif entry is not None and entry.get("passed") is True and not _under_bar(entry):
            problems.append(f"{where}.{key}.passed: true, but its cosine distance {entry.get('cosine_distance')!r} "
                            f"or NaN / Inf counts fail the bar ({MAX_COSINE_DISTANCE})")
    cache = e2e.get("cache") if isinstance(e2e.get("cache"), dict) else {"passed": True}
    if e2e.get("passed") is not (fp32.get("passed") is True and device.get("passed") is True
                                 and cache.get("passed") is True):
        problems.append(f"{where}.passed: not its fp32, device (and cache) verdicts together")
    return problems


def _under_bar(entry: dict[str, Any]) -> bool:
    """A device entry's numbers pass the bar: cosine distance under it, no component's NaN / Inf."""
    from .end_to_end import MAX_COSINE_DISTANCE

    distance = entry.get("cosine_distance")
    bad = entry.get("nonfinite") if isinstance(entry.get("nonfinite"), dict) else {"?": 1}
    return isinstance(distance, (int, float)) and distance < MAX_COSINE_DISTANCE and not any(bad.values())
