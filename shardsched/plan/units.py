"""Grouping layers into units (tensor fusion) and summing their costs.

[Note: fusion by block size]
An AllGather of M bytes costs alpha*steps + M/bw; below the block size
(`cost.comm.block_size_bytes`, ~90% of bandwidth) latency dominates, so small
consecutive layers are fused into one unit until the unit reaches the block size.
Layers are fused only when they get the same strategy (one `fully_shard` call
has one strategy).
"""
from __future__ import annotations

from shardsched.profile.types import LayerProfile, Profile
from shardsched.sim.scenario import UnitCost


def unit_name(layers: tuple[str, ...]) -> str:
    return layers[0] if len(layers) == 1 else f"{layers[0]}..{layers[-1]}"


def workspace_bytes(layers: list[LayerProfile]) -> int:
    """Transient bytes while a unit computes: its layers run one at a time, so the
    largest layer workspace (gradients of its largest saved tensors, materialised
    next to the activations during backward)."""
    return max((layer.workspace_bytes or layer.activation_bytes // 2 for layer in layers), default=0)


def unit_cost(layers: list[LayerProfile]) -> UnitCost:
    names = tuple(layer.name for layer in layers)
    return UnitCost(name=unit_name(names), layers=names,
                    params=sum(layer.params for layer in layers),
                    forward_seconds=sum(layer.forward_seconds for layer in layers),
                    backward_seconds=sum(layer.backward_seconds for layer in layers),
                    activation_bytes=sum(layer.activation_bytes for layer in layers),
                    workspace_bytes=workspace_bytes(layers),
                    input_bytes=sum(layer.input_bytes for layer in layers))


def group_layers(profile: Profile, strategies: list, *, block_params: int) -> list[list[int]]:
    """Consecutive layer indices per unit: fuse layers of the same strategy (and
    checkpointing, when `strategies` holds (strategy, checkpointed) pairs) while
    the unit is below `block_params` parameters (0 disables fusion)."""
    groups: list[list[int]] = []
    for i, layer in enumerate(profile.layers):
        if (groups and block_params > 0 and strategies[groups[-1][-1]] == strategies[i]
                and sum(profile.layers[j].params for j in groups[-1]) < block_params):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
