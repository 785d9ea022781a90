"""Calibration and distillation fine-tuning, in one process or under torchrun with DDP.

Activation ranges come from calibration (min/max over all batches, reduced across ranks so every rank
holds the same scales) and are frozen for fine-tuning. Each step's global batch is split across ranks
by rows, so a DDP run follows the same trajectory as one process on the whole batch (up to float
summation order).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .fake_quant import quant_layers, set_mode

StepFn = Callable[[int, int, float], None]  # (step, total, loss)


def ensure_distributed() -> tuple[int, int]:
    """Join the torchrun process group when launched under torchrun; returns (rank, world size)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and dist.is_available() and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        try:
            import torch_npu  # noqa: F401 - Ascend: hccl

            backend = "hccl"
        except ImportError:
            pass
        dist.init_process_group(backend)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def split_batches(tensors: dict[str, torch.Tensor], batch_size: int,
                  workers: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Batches in order (no shuffling: every rank and every run sees the same ones), through a DataLoader
    with ``dataloader_workers`` worker processes."""
    from torch.utils.data import DataLoader, Dataset

    from .library_config import current

    names = list(tensors)

    class Rows(Dataset):
        def __len__(self) -> int:
            return int(tensors[names[0]].shape[0])

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {k: tensors[k][i] for k in names}

    workers = current().dataloader_workers if workers is None else workers
    return list(DataLoader(Rows(), batch_size=batch_size, shuffle=False, num_workers=workers))


def _shard(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    return batch if world == 1 else {k: v[rank::world] for k, v in batch.items()}


def _outputs(out: Any) -> list[torch.Tensor]:
    from ..inputs.tensors import flatten_outputs

    return [t for t in flatten_outputs(out)[1] if t.is_floating_point()]


@torch.no_grad()
def calibrate(model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> None:
    """Observe activation ranges in float (fake quantization off), reduce them across ranks."""
    rank, world = ensure_distributed()
    set_mode(model, observing=True, calibrating=True)
    was = model.training
    model.eval()
    for batch in batches:
        model(**_shard(batch, rank, world))
    model.train(was)
    set_mode(model, calibrating=False)
    sync_observers(model)


def sync_observers(model: nn.Module) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    for layer in quant_layers(model).values():
        dist.all_reduce(layer.act_min, op=dist.ReduceOp.MIN)
        dist.all_reduce(layer.act_max, op=dist.ReduceOp.MAX)


def distill_loss(student: list[torch.Tensor], teacher: list[torch.Tensor], kind: str) -> torch.Tensor:
    if kind == "kl":  # the first output is taken as logits
        return F.kl_div(F.log_softmax(student[0], -1), F.log_softmax(teacher[0], -1), log_target=True,
                        reduction="batchmean")
    return sum(F.mse_loss(s, t) for s, t in zip(student, teacher, strict=False)) / len(student)


def finetune(student: nn.Module, teacher: nn.Module, batches: list[dict[str, torch.Tensor]], steps: int,
             lr: float, loss: str = "mse", on_step: StepFn | None = None) -> list[float]:
    """Train the fake-quant ``student`` to match the float ``teacher``'s outputs (no labels needed)."""
    from .library_config import current

    settings = current()
    rank, world = ensure_distributed()
    set_mode(student, observing=False)  # ranges stay as calibrated
    teacher.eval()
    student.train()
    _checkpointing(student, settings.gradient_checkpointing)
    model: nn.Module = student
    if world > 1:
        model = nn.parallel.DistributedDataParallel(student)
    if settings.compile_model:
        from ..backend.train_config import compile_backend

        model = torch.compile(model, backend=compile_backend(settings.compile_model))
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    device = params[0].device.type if params else "cpu"
    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(settings.mixed_precision or "")
    scaler = torch.amp.GradScaler(device, enabled=amp is torch.float16)
    history = []
    for step in range(steps):
        batch = _shard(batches[step % len(batches)], rank, world)
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            with torch.no_grad():
                target = [t.float() for t in _outputs(teacher(**batch))]
            value = distill_loss([t.float() for t in _outputs(model(**batch))], target, loss)
        opt.zero_grad(set_to_none=True)
        scaler.scale(value).backward()
        scaler.step(opt)
        scaler.update()
        history.append(float(value.detach()))
        if on_step is not None and rank == 0:
            on_step(step + 1, steps, history[-1])
    _checkpointing(student, False)
    student.eval()
    return history


def _checkpointing(model: nn.Module, on: bool) -> None:
    """transformers models through their own switch; other models recompute each quantized layer."""
    if hasattr(model, "gradient_checkpointing_enable"):
        if on:
            model.gradient_checkpointing_enable()
        elif getattr(model, "is_gradient_checkpointing", False):
            model.gradient_checkpointing_disable()
        return
    for layer in quant_layers(model).values():
        layer.checkpointed = on
