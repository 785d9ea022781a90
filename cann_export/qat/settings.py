"""Training settings of the library's own loops (QAT fine-tuning, calibration), set through
``cann.torch.config`` with the seeds' keys:

- ``mixed_precision``: False, True / "fp16" (autocast to float16 with a GradScaler) or "bf16";
- ``gradient_checkpointing``: recompute activations in backward (transformers models through their own
  ``gradient_checkpointing_enable()``, other models per quantized layer with torch.utils.checkpoint);
- ``dataloader_workers``: worker processes of the DataLoader that feeds calibration / fine-tuning batches;
- ``compile_model``: False, True ("auto": graph mode's backend, see backend/graph_mode.py) or a torch.compile
  backend name ("eager", "aot_eager").

The same keys apply to the user's own tracked model and unchanged loop: backend/train_config.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import OptionsError

KEYS = ("mixed_precision", "gradient_checkpointing", "dataloader_workers", "compile_model")


@dataclass(frozen=True)
class TrainSettings:
    mixed_precision: str | None = None  # None, "fp16" or "bf16"
    gradient_checkpointing: bool = False
    dataloader_workers: int = 0
    compile_model: str | None = None  # None or a torch.compile backend name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse(raw: dict[str, Any], base: TrainSettings | None = None) -> TrainSettings:
    """Validate the seeds' keys (values refused with the valid ones); unspecified keys keep ``base``."""
    values = (base or TrainSettings()).to_dict()
    if "mixed_precision" in raw:
        mp = raw["mixed_precision"]
        choices = {False: None, None: None, True: "fp16", "fp16": "fp16", "float16": "fp16", "bf16": "bf16",
                   "bfloat16": "bf16"}
        if not isinstance(mp, (bool, str, type(None))) or mp not in choices:
            raise OptionsError(f"mixed_precision={mp!r}; valid values: False, True, 'fp16', 'bf16'")
        values["mixed_precision"] = choices[mp]
    if "gradient_checkpointing" in raw:
        if not isinstance(raw["gradient_checkpointing"], bool):
            raise OptionsError(f"gradient_checkpointing={raw['gradient_checkpointing']!r}; valid values: True, False")
        values["gradient_checkpointing"] = raw["gradient_checkpointing"]
    if "dataloader_workers" in raw:
        workers = raw["dataloader_workers"]
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise OptionsError(f"dataloader_workers={workers!r}; valid values: an integer >= 0")
        values["dataloader_workers"] = workers
    if "compile_model" in raw:
        cm = raw["compile_model"]
        if cm is True:
            cm = "auto"  # aot_eager on npu-sim, torchair on an Ascend device, else torch.compile's default
        if cm is not False and cm is not None and not (isinstance(cm, str) and cm):
            raise OptionsError(f"compile_model={cm!r}; valid values: False, True, or a torch.compile backend name")
        values["compile_model"] = cm or None
    return TrainSettings(**values)
