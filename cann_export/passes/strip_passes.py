"""Strip passes: training-only structure out of the module (before capture) or the graph (after).

Module passes: unwrap gradient-checkpoint wrappers, replace Dropout with Identity, fold Conv+BatchNorm
pairs (qat.wrapping.fold_batchnorm), drop Identity from Sequentials.
Graph pass: onnxscript's BatchNorm-folding rules and onnx_ir's Identity / unused-value passes.
"""
from __future__ import annotations

from typing import Any


def _is_module(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.Module) and not isinstance(model, torch.jit.ScriptModule)


class UnwrapCheckpointPass:
    name = "unwrap-checkpoint"
    order = 10

    def apply_module(self, model: Any, ctx: Any) -> Any:
        if not _is_module(model):
            return model
        if getattr(model, "is_gradient_checkpointing", False) and hasattr(model, "gradient_checkpointing_disable"):
            model.gradient_checkpointing_disable()  # transformers models
        for name, child in list(model.named_children()):
            inner = getattr(child, "_checkpoint_wrapped_module", None)  # torch.distributed CheckpointWrapper
            if inner is not None:
                setattr(model, name, inner)
            self.apply_module(getattr(model, name), ctx)
        return model


class DropoutPass:
    name = "dropout"
    order = 20

    def apply_module(self, model: Any, ctx: Any) -> Any:
        import torch

        if not _is_module(model):
            return model
        dropouts = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                    torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, dropouts):
                    setattr(parent, name, _stripped_dropout(child))
        return model


def _stripped_dropout(child: Any) -> Any:
    """An Identity that still answers ``.p`` / ``.inplace`` (models such as GPT-2 read them)."""
    import torch

    stripped = torch.nn.Identity()
    stripped.p, stripped.inplace = 0.0, getattr(child, "inplace", False)
    return stripped


class ConvBnPass:
    """Fold each Conv -> BatchNorm pair of the module (torch.fx finds them, else Sequential neighbours) with
    torch's ``fuse_conv_bn_eval``; the same fold QAT's prepare applies. The graph pass catches the rest."""

    name = "fold-conv-bn"
    order = 30

    def apply_module(self, model: Any, ctx: Any) -> Any:
        from ..qat.wrapping import fold_batchnorm

        if not _is_module(model):
            return model
        replaced: dict[str, Any] | None = {} if ctx.reference_noise_deferred else None
        ctx.reports.strip.conv_bn_folded_in_module = fold_batchnorm(model, replaced=replaced)
        if replaced:  # the deferred float64 noise runs the model as prepare did (inputs/unfolded.py)
            from ..inputs.unfolded import kept

            ctx.unfolded_modules = kept(ctx, replaced)
        return model


class IdentityPass:
    name = "identity"
    order = 40

    def apply_module(self, model: Any, ctx: Any) -> Any:
        import torch

        if not _is_module(model):
            return model
        for seq in [m for m in model.modules() if isinstance(m, torch.nn.Sequential)]:
            keep = [(k, m) for k, m in seq._modules.items() if not isinstance(m, torch.nn.Identity)]
            if keep and len(keep) < len(seq._modules):
                seq._modules.clear()
                seq._modules.update(keep)
        return model


class GraphCleanupPass:
    """BatchNorm into Conv/ConvTranspose/Gemm, Identity out, unused initializers out: whatever exporter or
    input format produced the graph (TorchScript archives and torch.export programs included)."""

    name = "graph-cleanup"
    order = 50

    def apply_graph(self, model: Any, ctx: Any) -> Any:
        from ..graph import module_paths
        from ..graph.onnx_helpers import cleanup_graph

        model, report = cleanup_graph(model)
        ctx.optimize["conv_bn_folded_in_graph"] = report["conv_bn_folded"]
        ctx.optimize["identities_removed"] = report["identities_removed"]
        for key, mapping in module_paths.collect_origins(model).items():  # fused nodes have new names
            ctx.module_origins.setdefault(key, {}).update(mapping)
        ctx.module_paths.update(module_paths.collect(model))
        return model
