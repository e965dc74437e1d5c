"""A small GPT (nanoGPT-shaped) whose layers the planner can see.

Layers, in execution order: `embed`, `blocks.0` ... `blocks.{n-1}`, `head`.
`model(idx, targets)` returns the mean cross-entropy loss, so the model fits the
`(model, example_inputs)` contract of `shardsched plan --model python:...`.
The same config describes gpt2 / llama presets for analytic profiles
(`shardsched.profile.analytic`), whose parameter names and shapes match these
modules exactly, so a plan computed analytically applies to the real module.
Embedding and head weights are not tied: a tied weight would belong to two
units, which FSDP2 cannot shard twice.
"""
from __future__ import annotations

import math
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.models.gpt_config import GPTConfig  # noqa: F401  (re-exported)


def _norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden, eps=1e-5)
    return nn.LayerNorm(cfg.hidden)


class Embed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden) if cfg.learned_pos else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (b, s) -> (b, s, h)
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return x


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, heads, s, h/heads)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            self.gate = nn.Linear(cfg.hidden, cfg.ffn_size, bias=cfg.bias)
            self.up = nn.Linear(cfg.hidden, cfg.ffn_size, bias=cfg.bias)
            self.down = nn.Linear(cfg.ffn_size, cfg.hidden, bias=cfg.bias)
        else:
            self.fc = nn.Linear(cfg.hidden, cfg.ffn_size, bias=cfg.bias)
            self.proj = nn.Linear(cfg.ffn_size, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = _norm(cfg)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.ln(x))  # (b, s, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"heads={cfg.heads} must divide hidden={cfg.hidden}")
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head(cfg)
        self.apply(self._init)
        # GPT-2 scales residual projections by 1/sqrt(2 * layers).
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)

    def layer_names(self) -> list[str]:
        return ["embed", *(f"blocks.{i}" for i in range(len(self.blocks))), "head"]
