"""The parity verdict's rules behind the capture stage's narrow ``GraphJudge`` interface (cann_export/judging.py):
the trace check and the opset conversion's check judge a graph as parity does, without importing parity."""
from __future__ import annotations

from pathlib import Path
from typing import Any


class ParityJudge:
    """``GraphJudge`` by validators/parity.py's report and parity_metrics.py's verdict rule."""

    def graph_report(self, graph: Path, feeds: list[dict[str, Any]], expected: list[list[Any]], tolerance: Any,
                     what: str, labels: list[dict[str, Any]],
                     noise: list[list[float] | None] | None) -> dict[str, Any]:
        from .parity import parity_report

        return parity_report(graph, feeds, expected, tolerance, what, labels=labels, noise=noise)

    def outputs_agree(self, actual: list[Any], expected: list[Any], tolerance: Any) -> list[bool]:
        from ..parity_metrics import compare

        return [bool(compare(a, e, tolerance)["passed"]) for a, e in zip(actual, expected, strict=False)]


PARITY_JUDGE = ParityJudge()
