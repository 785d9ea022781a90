"""``insert_teacache`` read as a cache the bundle applies: which range of the denoiser a runtime may skip (on a DiT a
block range of ``transformer.transformer_blocks``, on a UNet its ``unet.mid_block``) and when (the policy: TeaCache's
threshold on the accumulated relative L1 change of the modulated input, or DeepCache's step interval). The hint as
the article writes it (``{"insert_teacache": ["transformer.transformer_blocks.1..2"]}``, or the block paths one by
one), with ``teacache_threshold`` / ``teacache_interval`` beside it; on the CLI ``--atc-hint
insert_teacache=transformer.transformer_blocks.1..2``. A range outside the model, or a path naming no component of
any pipeline, is refused; the article's ``unet.mid_block`` on SD3 (a denoiser this pipeline does not have) stays a
warning, as component_hints says it."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionsError
from .known_pipelines import PIPELINES, components_of

HINT = "insert_teacache"
THRESHOLD = "teacache_threshold"
INTERVAL = "teacache_interval"
DEFAULT_THRESHOLD = 0.1  # TeaCache's slow-to-fast range for DiTs is 0.05..0.3 of the accumulated relative L1
DEFAULT_INTERVAL = 2  # DeepCache's N: the full graph every second step
BLOCKS = "transformer_blocks"
MID = "mid_block"
BLOCK_PATH = re.compile(rf"{BLOCKS}\.([0-9]{{1,4}})(?:\.\.([0-9]{{1,4}}))?")
ANY_COMPONENT = {c for cls in PIPELINES for c in components_of(cls)}


@dataclass(frozen=True)
class CacheSpec:
    """A cached range of ``component`` (blocks ``start`` .. ``end - 1`` of ``module``) and its skip policy."""

    component: str
    module: str
    start: int
    end: int
    policy: dict[str, Any] = field(default_factory=dict)

    @property
    def skip(self) -> str:
        return f"{self.component}_cache_skip"

    @property
    def probe(self) -> str | None:
        """The graph giving the modulated input TeaCache measures (a DiT's threshold policy only)."""
        return f"{self.component}_cache_probe" if self.policy.get("kind") == "relative_l1" else None

    @property
    def graphs(self) -> dict[str, str]:
        named = {"full": self.component, "skip": self.skip}
        return {**named, "probe": self.probe} if self.probe else named

    @property
    def path(self) -> str:
        if self.module == MID:
            return f"{self.component}.{MID}"
        return f"{self.component}.{BLOCKS}.{self.start}..{self.end - 1}"

    def section(self) -> dict[str, Any]:
        """The manifest's ``pipeline.cache``: what a runtime needs to apply the cache."""
        return {"hint": HINT, "component": self.component, "module": self.path, "range": [self.start, self.end],
                "graphs": self.graphs, "policy": dict(self.policy),
                "residuals": list(residual_names(self)), "force_full": ["first step", "last step"]}


def residual_names(spec: CacheSpec) -> tuple[str, ...]:
    """The full graph's extra outputs (the skip graph's extra inputs): the range's residual, and on a DiT whose range
    ends before its last block the text stream's residual too."""
    return ("cache_residual", "cache_residual_context") if spec.policy.get("context") else ("cache_residual",)


def from_section(section: Any) -> CacheSpec | None:
    """The spec a bundle's ``pipeline.cache`` records (None: no cache)."""
    if not isinstance(section, dict):
        return None
    start, end = section["range"]
    component, policy = section["component"], dict(section["policy"])
    module = MID if str(section["module"]).endswith(MID) else BLOCKS
    numbers = [start, end, policy.get("threshold", 0), policy.get("every", 1)]
    if component not in ("transformer", "unet") or policy.get("kind") not in ("relative_l1", "interval") or \
            not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e6 for v in numbers):
        raise ValueError("not a cache this tool records")
    return CacheSpec(component, module, int(start), int(end), policy)


def _problem(path: str, text: str) -> OptionsError:
    return OptionsError(f"atc_hints {HINT}: {path!r} {text}. Name a block range of the denoiser, as "
                        f"{HINT}=transformer.transformer_blocks.0..1 on a DiT (SD3) or {HINT}=unet.mid_block on a "
                        "UNet pipeline")


def _paths(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise OptionsError(f"atc_hints {HINT}: expected module paths (a list or a comma-separated string), not "
                           f"{str(value)[:80]!r}")
    return [i.strip() for i in items]


def _number(hints: dict[str, Any], key: str, default: float, kind: type) -> Any:
    raw = hints.get(key, default)
    try:
        value = kind(raw)
    except (TypeError, ValueError) as e:
        raise OptionsError(f"atc_hints {key}={str(raw)[:40]!r} is not a number; write {key}={default}") from e
    low = 1 if kind is int else 0
    if not math.isfinite(value) or value < low:
        raise OptionsError(f"atc_hints {key}={str(raw)[:40]!r} is out of range; a threshold is >= 0 (0: the cache "
                           "off), an interval >= 1")
    return value


def _range(pipe: Any, denoiser: str, path: str, rest: str) -> tuple[str, int, int]:
    """(module, start, end) of one entry on the pipeline's own denoiser."""
    module = getattr(pipe, denoiser)
    blocks = getattr(module, BLOCKS, None)
    match = BLOCK_PATH.fullmatch(rest)
    if blocks is not None and match:
        start = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else start
        if last < start or last >= len(blocks):
            raise _problem(path, f"is outside the model: {denoiser} has {len(blocks)} blocks "
                                 f"({denoiser}.{BLOCKS}.0..{len(blocks) - 1})")
        return BLOCKS, start, last + 1
    if blocks is None and rest == MID and getattr(module, MID, None) is not None:
        return MID, 0, 1
    has = f"{denoiser}.{BLOCKS}.0..{len(blocks) - 1}" if blocks is not None else f"{denoiser}.{MID}"
    raise _problem(path, f"is not a range this {type(pipe).__name__}'s {denoiser} can cache (it can cache {has})")


def cache_spec(pipe: Any, hints: dict[str, Any] | None) -> tuple[CacheSpec | None, list[str]]:
    """(the cache ``hints`` ask of ``pipe``, or None; the entries left for component_hints to warn about: those
    naming another pipeline's denoiser). Raises OptionsError on an entry naming no component, a range outside the
    model, or entries that are not one contiguous range."""
    if not hints or HINT not in hints:
        if hints and (THRESHOLD in hints or INTERVAL in hints):
            raise OptionsError(f"atc_hints {THRESHOLD} / {INTERVAL} set without {HINT}: name the cached range "
                               f"({HINT}=transformer.transformer_blocks.0..1 or {HINT}=unet.mid_block)")
        return None, []
    cls = type(pipe).__name__
    names = components_of(cls)
    _, denoiser = PIPELINES[cls]
    found: list[tuple[str, int, int]] = []
    elsewhere: list[str] = []
    for path in _paths(hints[HINT]):
        head, _, rest = path.partition(".")
        if head not in ANY_COMPONENT:
            raise _problem(path, f"names no component: a {cls} bundle has {', '.join(names)}")
        if head not in names:
            elsewhere.append(path)  # the article's unet.mid_block on SD3: component_hints warns
            continue
        if head != denoiser:
            raise _problem(path, f"is not in the denoiser ({denoiser}); a cache skips part of the denoising loop")
        found.append(_range(pipe, denoiser, path, rest))
    if not found:
        return None, elsewhere
    found.sort(key=lambda r: r[1])
    module, start, end = found[0]
    for other, low, high in found[1:]:
        if other != module or low > end:
            raise _problem(str(hints[HINT]), "is not one contiguous range of blocks")
        end = max(end, high)
    blocks = getattr(getattr(pipe, denoiser), BLOCKS, None)
    if module == BLOCKS:
        policy = {"kind": "relative_l1", "threshold": _number(hints, THRESHOLD, DEFAULT_THRESHOLD, float),
                  "measures": f"{denoiser}.{BLOCKS}.0.norm1 (the modulated input)", "context": end < len(blocks)}
        if INTERVAL in hints:
            policy = {"kind": "interval", "every": _number(hints, INTERVAL, DEFAULT_INTERVAL, int),
                      "context": end < len(blocks)}
    else:
        if THRESHOLD in hints:
            raise OptionsError(f"atc_hints {THRESHOLD}: a UNet's {MID} cache runs on a step schedule (DeepCache's); "
                               f"give {INTERVAL}=N (the full graph every N steps) instead")
        policy = {"kind": "interval", "every": _number(hints, INTERVAL, DEFAULT_INTERVAL, int), "context": False}
    return CacheSpec(denoiser, module, start, end, policy), elsewhere


def bundle_components(cls: str, cache: CacheSpec | None) -> tuple[str, ...]:
    """The components of a ``cls`` bundle: the cache's own graphs follow the denoiser."""
    names = components_of(cls)
    if cache is None:
        return names
    at = names.index(cache.component) + 1
    extra = tuple(g for g in cache.graphs.values() if g != cache.component)
    return (*names[:at], *extra, *names[at:])
