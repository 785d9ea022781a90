"""The backend ``cann.torch.enable()`` made usable in this process, and the verbs that follow from it:
``enable``, ``disable``, ``set_device``. One holder per process; ``reset()`` forgets the choice."""
from __future__ import annotations

from typing import Any


class Session:
    def __init__(self) -> None:
        self.backend: str | None = None  # the enabled backend's name; None before enable() / after disable()

    def reset(self) -> None:
        self.backend = None

    def enable(self, backend: str = "auto") -> str:
        """Make ``npu`` usable (``auto``: the real Ascend device when torch_npu reports one, else npu-sim),
        name it ``cann`` too, and record the inputs of every outermost module call. Returns the backend."""
        from ..inputs import tracking
        from . import device_alias
        from .registry import resolve

        chosen = resolve(backend)
        chosen.activate()
        self.backend = chosen.name
        if chosen.device == "npu":
            device_alias.install()
            _complete_torch_npu()
        tracking.enable_global()
        from . import pipeline_facade as facade

        facade.install()  # a diffusers pipeline's parameters(), as the article calls it
        return chosen.name

    def disable(self) -> None:
        """Undo ``enable()``: input recording, the ``cann`` device name, graph mode and npu-sim's operator
        registrations (torch cannot rename PrivateUse1 back: ``npu`` stays the device's name, unusable)."""
        from ..inputs import tracking
        from . import device_alias, graph_mode
        from .npu_sim import uninstall

        tracking.disable_global()
        from . import pipeline_facade as facade

        facade.uninstall()
        device_alias.uninstall()
        graph_mode.enable_graph_mode(False)
        uninstall()
        self.backend = None

    def set_device(self, device: Any = "npu:0") -> None:
        """``"npu:0"`` (also ``"cann:0"``) enables a backend first when none is; ``"npu-sim"``, ``"cpu"``, ...
        enable that backend."""
        import torch

        name = str(device)
        if name.startswith("cann"):
            name = "npu" + name[4:]
        if name.startswith("npu") and name != "npu-sim":
            if self.backend is None:
                self.enable()
            torch.npu.set_device(torch.device(name))
        else:
            self.enable(name)


def _complete_torch_npu() -> None:
    """On a real torch_npu: ``torch.npu.enable_graph_mode`` (torch_npu 1.x's name) when it has none."""
    import torch

    module = getattr(torch, "npu", None)
    if module is not None and not hasattr(module, "enable_graph_mode"):
        from .graph_mode import enable_graph_mode

        module.enable_graph_mode = enable_graph_mode


def device_count() -> int:
    """Number of npu devices (1 under npu-sim; 0 before ``enable()`` when there is no real NPU)."""
    import torch

    module = getattr(torch, "npu", None)
    return int(module.device_count()) if module is not None else 0


def is_available() -> bool:
    import torch

    module = getattr(torch, "npu", None)
    return bool(module is not None and module.is_available())


SESSION = Session()
