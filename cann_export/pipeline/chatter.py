"""Third-party log chatter (torch.export's specialisation notes, dynamo and FX dumps, onnxscript's optimizer)
kept out of the user's terminal while a stage runs: each record is kept, bounded, in the manifest's
``warnings.third_party`` ("stage: logger: message"), and the CLI says how many in one line."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnxruntime", "transformers")
MAX_RECORDS, MAX_CHARS = 50, 400


class _Keep(logging.Handler):
    def __init__(self, stage: str, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.stage, self.into = stage, into

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.into) < MAX_RECORDS:
            try:
                text = record.getMessage()
            except Exception:  # noqa: BLE001 - a malformed record is dropped, never raised into the stage
                return
            self.into.append(f"{self.stage}: {record.name}: {' '.join(text.split())[:MAX_CHARS]}")


@contextlib.contextmanager
def kept(stage: str, into: list[str]) -> Iterator[None]:
    """While the block runs, warnings of the third-party loggers go to ``into`` instead of their handlers."""
    saved = []
    keep = _Keep(stage, into)
    known = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in LOGGERS]  # torch._logging's own too
    for name in dict.fromkeys([*LOGGERS, *known]):
        logger = logging.getLogger(name)
        if name not in LOGGERS and not logger.handlers and logger.propagate:
            continue  # reaches its top logger, which keeps it
        saved.append((logger, list(logger.handlers), logger.propagate))
        logger.handlers = [keep]
        logger.propagate = False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
