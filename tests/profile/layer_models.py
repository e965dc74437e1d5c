"""Two models with the same maths, written two ways (the MLP as an nn.Sequential inside each
block, or as a small custom module), for layer discovery and `--layers` tests."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, DEPTH, ROWS = 64, 4, 256


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, width: int, sequential: bool):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = (nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                    if sequential else MLP(width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self, sequential: bool):
        super().__init__()
        self.embed = nn.Linear(16, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, sequential) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x, y):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), y)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(ROWS, 16, generator=g), torch.randint(0, 10, (ROWS,), generator=g)


def sequential_mlp():
    torch.manual_seed(0)
    return Net(sequential=True), _inputs()


def custom_mlp():
    torch.manual_seed(0)
    return Net(sequential=False), _inputs()


class Wrapped(nn.Module):
    """A model held one attribute deep, with no stack of blocks anywhere: a conv chain."""

    def __init__(self):
        super().__init__()
        self.net = nn.Module()
        self.net.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3))
        self.net.head = nn.Linear(8, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.net.head(self.net.features(x).mean((2, 3))), y)


def wrapped_chain():
    return Wrapped(), (torch.randn(2, 3, 8, 8), torch.tensor([0, 3]))


def named_by_attribute():
    """The `python:` contract's way to name layers: a `shardsched_layers` attribute."""
    model, inputs = sequential_mlp()
    model.shardsched_layers = ["blocks.*.mlp", "LayerNorm"]
    return model, inputs
