"""Put any loaded model into inference mode, including graphs unlifted from torch.export archives and models with
torch.ao eager fake quantization (their observers frozen)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

_DROPOUT_OPS = ("dropout.default", "dropout_.default", "feature_dropout.default", "alpha_dropout.default",
                "feature_alpha_dropout.default")


def to_eval(model: Any, kind: str) -> Any:
    """``model.eval()``; a torch.export graph cannot switch mode, so its dropout and training-mode
    batch norm calls are rewritten to their inference forms."""
    if kind != "exported_program":
        try:
            model.eval()
        except NotImplementedError:  # an exported graph (torch.export's .module(), a PT2E model): mode is in the graph
            return to_eval(model, "exported_program")
        freeze_observers(model)  # a torch.ao QAT model: inference means its ranges stop moving
        return model
    import torch

    graph = model.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = str(node.target).removeprefix("aten.")
        if target in _DROPOUT_OPS:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            changed = True
        elif node.target is torch.ops.aten.batch_norm.default and len(node.args) > 5 and node.args[5]:
            node.args = (*node.args[:5], False, *node.args[6:])
            changed = True
    if changed:
        graph.lint()
        model.recompile()
    return model


def fake_quant_modules(model: nn.Module) -> dict[str, nn.Module]:
    from torch.ao.quantization import FakeQuantizeBase

    return {p: m for p, m in model.named_modules() if isinstance(m, FakeQuantizeBase)}


def freeze_observers(model: nn.Module) -> int:
    """Stop every torch.ao fake-quant module from updating its range; returns how many there are."""
    from torch.ao.quantization import disable_observer

    found = fake_quant_modules(model)
    if found:
        model.apply(disable_observer)
    return len(found)
