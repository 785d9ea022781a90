"""The narrow question the capture stage asks of the verdict: does a graph compute what the model does? Capture is
handed a ``GraphJudge`` (pipeline/table.py hands it the parity verdict's, validators/graph_judge.py) and never
imports the verdict's internals; the verdict's rules stay in validators/."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class GraphJudge(Protocol):
    """Parity's rules, as the capture stage may ask them."""

    def graph_report(self, graph: Path, feeds: list[dict[str, Any]], expected: list[list[Any]], tolerance: Any,
                     what: str, labels: list[dict[str, Any]],
                     noise: list[list[float] | None] | None) -> dict[str, Any]:
        """The graph at ``graph`` run on ``feeds`` (numpy) and judged against ``expected`` by parity's rules:
        ``{"passed", "reason"?, ...}`` (``what`` names the reference; ``labels``: each set's role)."""
        ...

    def outputs_agree(self, actual: list[Any], expected: list[Any], tolerance: Any) -> list[bool]:
        """Per output: whether ``actual`` passes parity's verdict rule against ``expected``."""
        ...
