"""A model of your own for `--model python:examples/my_model.py:build` (see docs/guide.md).

The function returns (model, example_inputs) where model(*example_inputs) is the
loss; shardsched traces it on fake tensors (exact bytes and FLOPs) and plans its layers.
"""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 256, depth: int = 6):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return nn.functional.cross_entropy(self.out(x), y)


def build():
    torch.manual_seed(0)
    return MLP(), (torch.randn(32, 256), torch.randint(0, 10, (32,)))
