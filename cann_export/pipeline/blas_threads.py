"""numpy's BLAS on one thread while the tool computes. Parity's comparisons (numpy dot products on OpenBLAS)
alternate with torch's and onnxruntime's own thread pools; OpenBLAS's threads, which spin after each call, then
take the cores those pools wait for: on this 2-core machine a 1M-element ``np.dot`` right after a torch matmul
took 3.9 ms on OpenBLAS's two threads and 0.47 ms on one, a torch matmul + dot pair 34 ms against 14 ms, and
GPT-2's validate stages (two graphs) 8.2-8.4 s against 5.8-6.3 s (2 interleaved runs each).

Only numpy's own BLAS library is limited (threadpoolctl, selected by its path: a torch build that loads its own
OpenBLAS keeps its threads), only by the outermost call (an export calling export, or two exports in threads of
one process, share one limit, restored when the last leaves)."""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"depth": 0, "limiter": None}


def one_blas_thread(fn: F) -> F:
    """Run ``fn`` with numpy's BLAS limited to one thread (the previous setting comes back after)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _leave()

    return wrapper  # type: ignore[return-value]


def _enter() -> None:
    with _LOCK:
        _STATE["depth"] += 1
        if _STATE["depth"] == 1:
            _STATE["limiter"] = _limit_numpy_blas()


def _leave() -> None:
    with _LOCK:
        _STATE["depth"] -= 1
        limiter, _STATE["limiter"] = (_STATE["limiter"], None) if _STATE["depth"] == 0 else (None, _STATE["limiter"])
        if limiter is not None:
            limiter.restore_original_limits()


def _limit_numpy_blas() -> Any:
    import os

    import numpy
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    home = os.path.dirname(os.path.dirname(numpy.__file__))  # site-packages: numpy/ and numpy.libs/
    own = [i["filepath"] for i in controller.info() if i["user_api"] == "blas"
           and os.path.basename(os.path.dirname(i["filepath"])).startswith("numpy")
           and i["filepath"].startswith(home)]
    return controller.select(filepath=own).limit(limits=1) if own else None
