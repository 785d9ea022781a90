"""numpy's BLAS on one thread while the tool computes. Parity's comparisons (numpy dot products on OpenBLAS)
alternate with torch's and onnxruntime's own thread pools; OpenBLAS's threads, which spin after each call, then
take the cores those pools wait for: on this 2-core machine a 1M-element ``np.dot`` right after a torch matmul
took 3.9 ms on OpenBLAS's two threads and 0.47 ms on one, a torch matmul + dot pair 34 ms against 14 ms, and
GPT-2's validate stages (two graphs) 8.2-8.4 s against 5.8-6.3 s (2 interleaved runs each).
threadpoolctl limits the BLAS libraries already loaded (numpy's is loaded first) and restores the caller's
setting afterwards; torch's own OpenMP pool is left alone."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def one_blas_thread(fn: F) -> F:
    """Run ``fn`` with numpy's BLAS limited to one thread (re-entrant; the previous limit comes back after)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import numpy  # noqa: F401 - loads the BLAS library threadpoolctl limits
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
