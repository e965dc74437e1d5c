"""A recomputed unit next to one that is not ([Note: an input the unit before keeps] and [Note:
the output a recomputed unit hands over] in sim/scenario.py): an input the layer before saved
is counted once, by whichever unit retains it, checked against FSDP2's own measurement."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from shardsched.api import plan_model

from ..plan._generated import MessagePassing


class _Gnn(nn.Module):
    """Message passing layers, each ending in a ReLU (which saves the layer's output); the next
    layer gathers from that output and saves none of it."""

    def __init__(self, d: int = 64, depth: int = 3):
        super().__init__()
        self.inp, self.out = nn.Linear(16, d), nn.Linear(d, 7)
        self.layers = nn.ModuleList(MessagePassing(d) for _ in range(depth))

    def forward(self, x, src, dst, y):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, src, dst)
        return nn.functional.cross_entropy(self.out(h), y)


class _Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class _Cnn(nn.Module):
    """Conv blocks ending in a ReLU; the next block's conv saves that output again."""

    def __init__(self, c: int = 16, depth: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(depth))
        self.head = nn.Linear(c, 10)

    def forward(self, x, y):
        h = self.stem(x)
        for blk in self.blocks:
            h = blk(h)
        return nn.functional.cross_entropy(self.head(h.mean((2, 3))), y)


def _gnn():
    gen = torch.Generator().manual_seed(0)
    nodes, edges = 200, 800
    return _Gnn(), (torch.randn(nodes, 16, generator=gen), torch.randint(0, nodes, (edges,), generator=gen),
                    torch.randint(0, nodes, (edges,), generator=gen), torch.randint(0, 7, (nodes,), generator=gen))


def _cnn():
    gen = torch.Generator().manual_seed(0)
    return _Cnn(), (torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen))


@pytest.mark.parametrize("build,strategy", [
    (_gnn, "full_shard+sac,inp=shard_grad_op,layers.1=shard_grad_op,out=shard_grad_op"),  # was +4.7%
    (_gnn, "full_shard+ckpt,layers.0=full_shard,out=full_shard"),
    (_cnn, "full_shard+ckpt,blocks.0=full_shard,blocks.2=full_shard"),
    (_cnn, "full_shard,blocks.1=full_shard+sac,blocks.3=full_shard+ckpt")])
def test_mixed_recomputation_predicts_the_verified_peak(build, strategy):
    model, inputs = build()
    plan = plan_model(model, inputs, world=2, strategy=strategy, headroom="0")
    error = plan.predicted.peak_bytes / plan.verified.peak_bytes - 1
    assert abs(error) < 0.005, (strategy, error)
