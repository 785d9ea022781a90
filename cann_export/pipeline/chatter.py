"""Third-party log chatter (torch.export's specialisation notes, dynamo and FX dumps, onnxscript's optimizer)
kept out of the user's terminal while a stage runs: each record is kept, bounded, in the manifest's
``warnings.third_party`` ("stage: logger: message"), and the CLI says how many, from which libraries, in one line
(``hidden_line``). torchao's "Failed to load ..._C_*.so" lines (its optional kernels, at import) are among them."""
from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator

LOGGERS = ("torch", "torchao", "onnxscript", "onnx_ir", "onnxruntime", "onnx", "transformers", "huggingface_hub",
           "accelerate", "safetensors")
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


def hidden_line(records: list[str]) -> str | None:
    """``12 warnings from torch, transformers hidden; --verbose shows them`` for the kept records, or None."""
    if not records:
        return None
    by_library = Counter(str(r).split(": ", 2)[1].split(".")[0] if str(r).count(": ") >= 2 else "other"
                         for r in records)
    libraries = ", ".join(name for name, _ in by_library.most_common())
    return f"{len(records)} warning(s) from {libraries} hidden; --verbose shows them"
