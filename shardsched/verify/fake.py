"""Fake copies of a model and its inputs: the same modules, code and shapes, no storage.

[Note: a fake copy keeps the model's code]
Verification must run the model's own `forward` under the engine, so the copy is the model
itself, deep-copied with every parameter and buffer replaced by a fake tensor of the same
shape, dtype and `requires_grad` (a tensor reached by two names, a tied weight, gets one
fake, so ties stay ties). `copy.deepcopy` takes the replacements from its memo, so no real
storage is copied: a model on the meta device (how `hf:` models are planned) and a model
in memory (a `python:` model) are copied alike. Plain tensor attributes that are neither
parameters nor buffers are copied as they are; `FakeTensorMode(allow_non_fake_inputs=True)`
turns them into fakes when an op reads them.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode


def _fake(t: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
    """An empty fake CPU tensor like `t` (meta or real), outside autograd."""
    with mode:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")


def fake_copy(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """`model` with fake parameters and buffers (see the module note); `model` is untouched."""
    memo: dict[int, torch.Tensor] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in memo:
            memo[id(p)] = nn.Parameter(_fake(p.detach(), mode), requires_grad=p.requires_grad)
    for _, b in model.named_buffers(remove_duplicate=False):
        if id(b) not in memo:
            memo[id(b)] = _fake(b, mode)
    return copy.deepcopy(model, memo)


def fake_inputs(inputs: tuple, mode: FakeTensorMode) -> tuple:
    """The example inputs as fake tensors (values are not kept: a model whose code reads them,
    a boolean mask, cannot run fake and is verified for real: `engine`)."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return _fake(x, mode)
        if isinstance(x, (tuple, list)):
            return type(x)(one(v) for v in x)
        if isinstance(x, dict):
            return {k: one(v) for k, v in x.items()}
        return x
    return tuple(one(x) for x in inputs)
