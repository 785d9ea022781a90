"""Models whose fp16 divergence starts at a known module, behind values that are wrong by design (mask
fills) or in front of blocks whose branches it kills, for the origin and --fix-precision tests.

Each builder returns ``(model, inputs, origin module)``; inputs are a dict named after forward's parameters."""
from __future__ import annotations

import torch
from torch import nn


def _tokens(vocab, seq=12, batch=2, pad=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq - pad:] = 0  # a padded row: the mask fill holds float32 min, -inf / -65504 in fp16
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g), "attention_mask": mask}


def qwen2_residual_growth():
    """transformers Qwen2 whose layer-0 MLP was trained into outputs past 1e5 (up projection 1000x, down
    projection 10000x): its down projection, and the residual after it, pass 65504.
    The causal + padding mask fill before it is -inf in fp16 and heals in the softmax."""
    from transformers import Qwen2Config, Qwen2Model

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    model = Qwen2Model(cfg).eval()
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight.mul_(1000.0)
        model.layers[0].mlp.down_proj.weight.mul_(10000.0)
    return model, _tokens(200), "layers.0.mlp"


class NaiveRMSNorm(nn.Module):
    """RMSNorm without the fp32 upcast: x.pow(2).mean() passes 65504 once |x| > 256."""

    def __init__(self, width, gain):
        super().__init__()
        self.weight = nn.Parameter(torch.full((width,), gain))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.softmax(q @ k.transpose(-1, -2) / (w // self.heads) ** 0.5, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, w))


class Block(nn.Module):
    def __init__(self, width, heads, gain):
        super().__init__()
        self.attn_norm = NaiveRMSNorm(width, gain)
        self.attn = Attention(width, heads)
        self.mlp_norm = NaiveRMSNorm(width, gain)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width, bias=False), nn.SiLU(), nn.Linear(2 * width, width,
                                                                                               bias=False))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class RmsDecoder(nn.Module):
    """A decoder whose every RMSNorm overflows in fp16 (embeddings ~ 400, no upcast: x.pow(2) is inf, the
    norm's output 0). A dead branch is a few percent of the residual, so the residual Add around it still
    passes the output rule, and only the final norm's zeros fail the output: the origin is nonetheless
    layer 0's first norm, and a fix must keep every norm."""

    def __init__(self, vocab=100, width=32, heads=2, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        with torch.no_grad():
            self.embed.weight.mul_(400.0)
        self.layers = nn.ModuleList([Block(width, heads, 20.0) for _ in range(layers)])
        self.norm = NaiveRMSNorm(width, 1.0)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def rms_decoder():
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    return RmsDecoder().eval(), {"input_ids": ids}, "layers.0.attn_norm"
