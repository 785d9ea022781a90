"""The cache applied in diffusers' loop: the hosted denoiser runs, step by step, the full graph (which also gives the
cached range's residuals) or the skip graph (fed the last residuals), as the recorded policy decides. TeaCache's
policy (``relative_l1``): the probe's modulated input is compared with the last step's, the relative L1 changes
accumulate, and while the sum stays under the threshold the step is skipped (a full step resets it). DeepCache's
(``interval``): the full graph every N-th step. The first and last steps always run in full, so a threshold of 0
(or an interval of 1) is the uncached run."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .cache_spec import CacheSpec, residual_names
from .hosted import HostedTransformer, HostedUNet, Run


class StepPolicy:
    """Whether each step runs the full graph: ``policy`` as cache_spec records it."""

    def __init__(self, policy: dict[str, Any]):
        self.policy = policy
        self.accumulated = 0.0
        self.previous: np.ndarray | None = None

    def reset(self) -> None:
        self.accumulated = 0.0
        self.previous = None

    def full(self, step: int, last: bool, modulated: np.ndarray | None) -> bool:
        forced = step == 0 or last
        if self.policy["kind"] == "interval":
            return forced or step % int(self.policy["every"]) == 0
        previous, self.previous = self.previous, modulated
        if forced or previous is None or modulated is None:
            self.accumulated = 0.0
            return True
        base = float(np.mean(np.abs(previous.astype(np.float64))))
        change = float(np.mean(np.abs(modulated.astype(np.float64) - previous))) / base if base > 0 else np.inf
        self.accumulated += change
        if self.accumulated < float(self.policy["threshold"]):
            return False
        self.accumulated = 0.0
        return True


class _Cached:
    """Mixed into a hosted denoiser: ``call`` runs the full or the skip graph per the policy."""

    def setup(self, spec: CacheSpec, skip: Run, probe: Run | None, scheduler: Any) -> None:
        self.spec = spec
        self.skip_run = skip
        self.probe_run = probe
        self.timesteps_of = scheduler
        self.step_policy = StepPolicy(spec.policy)
        self.residuals: dict[str, np.ndarray] = {}
        self.steps: list[bool] = []  # the current run's decisions: True for a full step
        self.previous_t: float | None = None

    def _last(self, t: float) -> bool:
        timesteps = getattr(self.timesteps_of, "timesteps", None)
        return timesteps is not None and len(timesteps) > 0 and float(timesteps[-1]) == t

    def call(self, **feed: Any) -> dict[str, torch.Tensor]:
        t = float(torch.as_tensor(feed["timestep"]).reshape(-1)[0])
        if self.previous_t is None or t >= self.previous_t:  # the timesteps fall within a run: a new run
            self.steps = []
            self.residuals = {}
            self.step_policy.reset()
        self.previous_t = t
        arrays = {k: v.detach().cpu().numpy() for k, v in feed.items()}
        modulated = self.probe_run(arrays)["modulated_input"] if self.probe_run is not None else None
        full = self.step_policy.full(len(self.steps), self._last(t), modulated) or not self.residuals
        self.steps.append(full)
        if full:
            out = super().call(**feed)  # type: ignore[misc]
            self.residuals = {n: out[n].numpy() for n in residual_names(self.spec)}
            return out
        out = self.skip_run({**arrays, **self.residuals})
        self.nonfinite += sum(int(v.size - np.count_nonzero(np.isfinite(v))) for v in out.values())
        return {k: torch.from_numpy(np.array(v)) for k, v in out.items()}


class CachedTransformer(_Cached, HostedTransformer):
    pass


class CachedUNet(_Cached, HostedUNet):
    pass


CACHED = {"transformer": CachedTransformer, "unet": CachedUNet}


def cached_denoiser(spec: CacheSpec, name: str, runs: dict[str, Run], config: Any, scheduler: Any) -> Any:
    """The hosted ``name`` denoiser applying ``spec`` with the graphs' ``runs`` (by component name)."""
    module = CACHED[name](name, runs[name], config)
    module.setup(spec, runs[spec.skip], runs.get(spec.probe) if spec.probe else None, scheduler)
    return module


def skipped_steps(pipe: Any) -> list[int]:
    """The steps the last run skipped (their indices), from the pipeline's cached denoiser."""
    module = next(m for m in pipe.components.values() if isinstance(m, _Cached))
    return [i for i, full in enumerate(module.steps) if not full]
