"""Models whose fp16 values leave the range, for the per-SoC device model (tests/verdict/test_soc_overflow.py), and a
torch per-op emulation of each overflow mode written from the device rule (not the tool's Emulator):
every op reads and writes fp16; past +-65504 is inf ("inf_nan", IEEE) or +-65504 with NaN set to 0
("saturation"); a constant is converted by ATC on the host, which saturates in either mode."""
from __future__ import annotations

import math

import torch
from torch import nn

FP16_MAX = 65504.0


def on_device(t: torch.Tensor, overflow: str) -> torch.Tensor:
    """A value written in fp16 on a SoC of ``overflow`` mode (held in fp32)."""
    half = t.float().half().float()
    if overflow == "saturation":
        half = torch.nan_to_num(half, nan=0.0, posinf=FP16_MAX, neginf=-FP16_MAX)
    return half


def constant(value: float) -> torch.Tensor:
    """A constant as ATC converts it to fp16: saturated, never inf."""
    return torch.tensor(value).clamp(-FP16_MAX, FP16_MAX).half().float()


class ScaledSoftmax(nn.Module):
    """softmax(linear(x) * 300), the linear 300 x identity: the logits of a row's largest entry (about 0.9) pass
    65504, the others fit. (A constant product such as (x * 300) * 300 is folded into one constant, 90000, which
    ATC converts to 65504: no overflow on the device.)"""

    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(8, 8, bias=False)
        with torch.no_grad():
            self.scale.weight.copy_(300.0 * torch.eye(8))

    def forward(self, x):
        return torch.softmax(self.scale(x) * 300.0, dim=-1)


def scaled_softmax_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 8, generator=g) - 0.5  # |x| <= 0.5: logits up to 45000, in range
    x[torch.arange(4), torch.randint(0, 8, (4,), generator=g)] = 0.9 + 0.05 * torch.rand(4, generator=g)
    return x


def scaled_softmax_on_device(x: torch.Tensor, overflow: str) -> torch.Tensor:
    """ScaledSoftmax computed op by op as the device does (softmax accumulates in fp32, writes fp16)."""
    h = on_device(on_device(x, overflow) @ (300.0 * torch.eye(8)), overflow)  # 300 is exact in fp16
    logits = on_device(h * constant(300.0), overflow)
    return on_device(torch.softmax(logits, dim=-1), overflow)


class Saturating(nn.Module):
    """An output past the range: 1e5 on a saturating SoC reads 65504, finite and wrong."""

    def forward(self, x):
        return (x * 400.0) * 400.0


class LinearSoftmax(nn.Module):
    """Linear -> x 1e4 -> softmax: logits about 1e4, in range; real fp16 computes it correctly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(16, 10)

    def forward(self, x):
        return torch.softmax(self.lin(x) * 1e4, dim=-1)


class MaskedAttention(nn.Module):
    """DeBERTa's masked attention: scores filled with finfo(dtype).min where the padded mask is 0 (rows of padded
    queries are masked whole) and a softmax; in fp32 the fill is -3.4e38, past fp16's range."""

    def __init__(self, dim: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, x, attention_mask):
        keep = attention_mask[:, None, :].bool() & attention_mask[:, :, None].bool()
        scores = self.q(x) @ self.k(x).transpose(-1, -2) * self.scale
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        return self.out(torch.softmax(scores, dim=-1) @ self.v(x))


def masked_attention_inputs() -> dict[str, torch.Tensor]:
    mask = torch.ones(2, 10, dtype=torch.int64)
    mask[1, 6:] = 0
    return {"x": torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1)), "attention_mask": mask}


def tiny_deberta() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """transformers DebertaV2Model from a tiny config, with a padded attention mask."""
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=37, max_position_embeddings=64, relative_attention=True,
                          position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"])
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 7:] = 0
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    return DebertaV2Model(cfg).eval(), {"input_ids": ids, "attention_mask": mask}
