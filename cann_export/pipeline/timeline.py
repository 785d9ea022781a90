"""``--trace trace.json``: the export pipeline's stage timeline in Chrome trace format (opens in Perfetto
and chrome://tracing): one complete ("X") event per stage that ran, with its status. Rewritten after each
stage, so a failed export still leaves the stages up to the one that failed."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ProgressFn = Callable[[int, str, str, float], None]


class StageTimeline:
    def __init__(self, path: str | Path) -> None:
        from ..fs.report_paths import check_report_path

        self.path = check_report_path(path, "--trace")
        self.events: list[dict[str, Any]] = []
        self._end_us = 0.0  # where the last stage ended: stages run one after another

    def wrap(self, progress: ProgressFn | None) -> ProgressFn:
        """A progress callback that records each finished stage, then calls ``progress``."""
        def record(index: int, stage: str, status: str, seconds: float) -> None:
            # a stage reported late (from the load sandbox's child) still starts after the one before it
            end_us = max(time.time() * 1e6, self._end_us + seconds * 1e6)
            self._end_us = end_us
            self.events.append({"name": stage, "cat": "stage", "ph": "X", "ts": round(end_us - seconds * 1e6, 3),
                                "dur": round(seconds * 1e6, 3), "pid": os.getpid(), "tid": 0,
                                "args": {"index": index, "status": str(status)}})
            self.write()
            if progress is not None:
                progress(index, stage, status, seconds)
        return record

    def write(self) -> None:
        from ..errors import WriteError
        from ..fs.atomic import write_text

        trace = {"traceEvents": [{"name": "process_name", "ph": "M", "pid": os.getpid(), "tid": 0,
                                  "args": {"name": "cann-export"}}, *self.events], "displayTimeUnit": "ms"}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text(self.path, json.dumps(trace, allow_nan=False))
        except OSError as e:
            raise WriteError(f"--trace: cannot write the stage timeline ({e.strerror or e}); pass a file in a "
                             "directory you can write", path=str(self.path)) from e
