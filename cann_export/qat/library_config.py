"""The library-wide settings ``cann.torch.config`` sets, and what follows from them: whether the user's own
training loop becomes a QAT loop (qat/auto.py), the quant config it uses, and the training settings of the
library's own loops (qat/settings.py). One holder per process; ``reset()`` restores the defaults."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import OptionsError
from . import settings as training

CONFIG_KEYS = ("mixed_precision", "gradient_checkpointing", "dataloader_workers", "compile_model",
               "quantization_aware_training", "quant_config")


class Session:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """The defaults: QAT off, an empty quant config, default training settings (auto-QAT hooks removed)."""
        self.quantization_aware_training = False
        self.quant_config: dict[str, Any] = {}
        self.train = training.TrainSettings()
        from ..backend import train_config
        from . import auto

        auto.uninstall()
        train_config.reconcile_all(self.train)

    def settings(self) -> dict[str, Any]:
        return {"quantization_aware_training": self.quantization_aware_training, "quant_config": self.quant_config,
                **self.train.to_dict()}

    def configure(self, **settings: Any) -> dict[str, Any]:
        """Validate and apply ``cann.torch.config``'s keys (unknown keys and bad values are refused before
        anything changes); returns the current settings."""
        from .quant_config import parse

        unknown = sorted(set(settings) - set(CONFIG_KEYS))
        if unknown:
            raise OptionsError(f"unknown cann.torch.config key(s) {', '.join(unknown)}; known keys: "
                               f"{', '.join(CONFIG_KEYS)}")
        quant_config = parse(settings["quant_config"]).to_dict() if "quant_config" in settings else self.quant_config
        qat = settings.get("quantization_aware_training", self.quantization_aware_training)
        if not isinstance(qat, bool):
            raise OptionsError("quantization_aware_training must be True or False")
        train = training.parse({k: v for k, v in settings.items() if k in training.KEYS}, self.train)
        from ..backend import train_config

        train_config.check_all(train)
        self.train, self.quantization_aware_training, self.quant_config = train, qat, quant_config
        train_config.reconcile_all(train)  # the user's tracked models follow the training keys at once
        if settings.get("dataloader_workers"):
            import warnings

            warnings.warn(train_config.workers_note(train.dataloader_workers), stacklevel=3)
        from . import auto

        if qat:  # the user's own loop becomes a QAT loop (see qat/auto.py)
            auto.install(quant_config)
        else:
            auto.uninstall()
        return self.settings()

    def check_applied(self, model: Any) -> None:
        """QAT configured but never applied would silently export a float model: refuse with what to do."""
        from .wrapping import qat_state

        if not self.quantization_aware_training or not hasattr(model, "named_modules"):
            return
        if qat_state(model) is None and not _ao_quantized(model):
            raise OptionsError(
                "cann.torch.config(quantization_aware_training=True) is set, but this model was never trained "
                "after it: fake quantization goes in at the model's first forward call in train mode. Run the "
                "training loop after config(...), or call cann.torch.prepare(model) before training; to export "
                "in float, call cann.torch.config(quantization_aware_training=False) first")

    @contextlib.contextmanager
    def exporting(self, model: Any) -> Iterator[None]:
        """Around an export of ``model``: refuse QAT configured but never applied, lift auto-QAT's global
        module hooks while the graph is captured (see ``auto.suspended``) and the training keys' effects
        (autocast, recomputation, compilation) off the model while it is copied."""
        self.check_applied(model)
        from ..backend import train_config
        from . import auto

        with auto.suspended(), train_config.lifted(model):
            yield

    def prepare(self, model: Any, example_inputs: Any = None) -> Any:
        """Insert fake quantization (BatchNorm folded) as configured; returns a new module."""
        from .wrapping import prepare

        if not self.quantization_aware_training:
            raise OptionsError("cann.torch.prepare needs cann.torch.config(quantization_aware_training=True, ...) "
                               "first")
        return prepare(model, example_inputs, self.quant_config)


def _ao_quantized(model: Any) -> bool:
    """A model prepared with PyTorch's own QAT API (FakeQuantize modules) counts as quantized."""
    from torch.ao.quantization import FakeQuantizeBase

    return any(isinstance(m, FakeQuantizeBase) for m in model.modules())


SESSION = Session()


def current() -> training.TrainSettings:
    """The training settings the library's own loops (calibration, fine-tuning) follow."""
    return SESSION.train
