"""Built-in quantization lowering: fake-quant modules and torch.ao observers to ONNX Q/DQ."""
from __future__ import annotations

from ..hooks.specs import hookimpl
from ..qat.lowering import LowerFakeQuant, LowerTorchAoFakeQuant


@hookimpl
def register_passes(register):
    register(LowerTorchAoFakeQuant())
    register(LowerFakeQuant())
