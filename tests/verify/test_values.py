"""`verify.values.own_values`: a run on the fake process group gathers the model's own values."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardsched.verify.values import own_values


def _gathered(write: bool) -> list[float]:
    """Per Linear, the largest difference between the weight its forward sees and the model's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    original = copy.deepcopy(model)
    seen: list[float] = []
    held = [p.data for p in model.parameters()]  # no gathered buffer reuses their memory (and values)
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        if write:
            own_values(model)
        mesh = init_device_mesh("cpu", (4,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for k in (0, 2):
            model[k].register_forward_pre_hook(
                lambda m, a, k=k: seen.append((m.weight - original[k].weight).abs().max().item()))
        model(torch.randn(2, 8)).sum().backward()
    finally:
        dist.destroy_process_group()
    assert len(held) == 4
    return seen


def test_the_gathered_weights_are_the_models_own():
    """The fake process group gathers nothing into the other ranks' slots (three quarters of
    each weight at world 4); with `own_values` the forward sees the model's values exactly."""
    assert _gathered(write=True) == [0.0, 0.0]
    assert max(_gathered(write=False)) > 0
