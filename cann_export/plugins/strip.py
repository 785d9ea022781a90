"""Strip passes: training-only structure out of the module (before capture) or the graph (after).

Module passes: unwrap gradient-checkpoint wrappers, replace Dropout with Identity, fold Conv+BatchNorm
pairs that sit next to each other in a Sequential, drop Identity from Sequentials.
Graph pass: fold every BatchNormalization fed only by a Conv into the Conv's weights, whatever exporter
or input format produced the graph (TorchScript archives and torch.export programs included).
"""
from __future__ import annotations

import itertools
from typing import Any

from ..hookspecs import hookimpl


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


class SequentialConvBnPass:
    """Fold ``Conv -> BatchNorm`` neighbours inside ``nn.Sequential`` (the graph pass catches the rest)."""

    name = "fold-conv-bn"
    order = 30

    def apply_module(self, model: Any, ctx: Any) -> Any:
        import torch
        from torch.nn.utils.fusion import fuse_conv_bn_eval

        if not _is_module(model):
            return model
        convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
        bns = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
        for seq in [m for m in model.modules() if isinstance(m, torch.nn.Sequential)]:
            names = list(seq._modules)
            for a, b in itertools.pairwise(names):
                conv, bn = seq._modules[a], seq._modules[b]
                if isinstance(conv, convs) and isinstance(bn, bns) and bn.track_running_stats \
                        and bn.running_mean is not None:
                    seq._modules[a] = fuse_conv_bn_eval(conv.eval(), bn.eval())
                    seq._modules[b] = torch.nn.Identity()
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


class GraphConvBnFoldPass:
    name = "fold-conv-bn-graph"
    order = 50

    def apply_graph(self, model: Any, ctx: Any) -> Any:
        from ..onnx_utils import fold_conv_batchnorm

        ctx.optimize["conv_bn_folded_in_graph"] = fold_conv_batchnorm(model)
        return model


class IdentityGraphPass:
    name = "identity-graph"
    order = 60

    def apply_graph(self, model: Any, ctx: Any) -> Any:
        from ..onnx_utils import remove_identities

        ctx.optimize["identities_removed"] = remove_identities(model)
        return model


@hookimpl
def register_passes(register):
    for p in (UnwrapCheckpointPass(), DropoutPass(), SequentialConvBnPass(), IdentityPass(),
              GraphConvBnFoldPass(), IdentityGraphPass()):
        register(p)
