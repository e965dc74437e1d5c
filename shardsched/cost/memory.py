"""Bytes per parameter of each kind of state, by precision and optimizer.

The per-worker memory model (../shared/DESIGN.md): at rest a unit holds
(param + grad + optimizer) bytes * P / shards; mixed-precision Adam is
4 + 4 + 8 = 16 bytes per parameter (ZeRO paper, Rajbhandari et al. 2020, Sec. 3.1:
"2+2+K" counts the fp16 copy; FSDP2 keeps fp32 sharded params and casts to bf16 when
it gathers, so here the 2-byte compute copy exists only while unsharded).
The time-resolved part (what is live at which compute step) is in `sim.memory`.
"""
from __future__ import annotations

from dataclasses import dataclass

from shardsched.core.types import Optimizer, Precision, Strategy


@dataclass(frozen=True, kw_only=True)
class StateBytes:
    """Bytes per parameter, one field per kind of state."""

    param: int
    """Persistent (sharded or replicated) parameter: fp32 master."""
    grad: int
    """Persistent gradient after reduction (fp32, in the parameter's dtype)."""
    optimizer: int
    """Optimizer state: Adam 8 (m, v), SGD-momentum 4."""
    unsharded_param: int
    """Gathered compute copy: 4 in fp32, 2 in bf16 mixed precision."""
    unsharded_grad: int
    """Gradient as autograd produces it (compute dtype)."""
    reduce: int
    """Reduction buffer dtype (FSDP2 reduce_dtype: fp32 in both precisions)."""

    @property
    def at_rest(self) -> int:
        return self.param + self.grad + self.optimizer


def state_bytes(precision: Precision, optimizer: Optimizer) -> StateBytes:
    compute = 2 if precision is Precision.BF16_MIXED else 4
    return StateBytes(param=4, grad=4, optimizer=8 if optimizer is Optimizer.ADAM else 4,
                      unsharded_param=compute, unsharded_grad=compute, reduce=4)


def shards(strategy: Strategy, world: int, *, local: int | None = None) -> int:
    """How many ways a unit's persistent state is split (hybrid strategies: over the
    `local` workers of a node, `cost.strategy`)."""
    if strategy is Strategy.REPLICATE:
        return 1
    if local is not None and strategy in (Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP):
        return local
    return world


def shard_numel(params: int, dims: tuple[tuple[int, int], ...], n: int) -> int:
    """Elements of a unit per worker when sharded `n` ways, as FSDP2 lays it out:
    every parameter's dim 0 is padded to a multiple of n (`FSDPParam._init_sharded_param`:
    `chunk` along dim 0, each shard padded to the largest). `dims` are (dim-0 size,
    numel) per parameter; without them the unit's total is rounded up instead."""
    if n == 1:
        return params
    if not dims:
        return -(-params // n)
    return sum(-(-d0 // n) * (numel // d0) for d0, numel in dims if d0)


def model_states_bytes(params: int, strategy: Strategy, world: int, sb: StateBytes,
                       dims: tuple[tuple[int, int], ...] = (), *,
                       local: int | None = None) -> int:
    """ZeRO's "model states" of a unit at rest, per worker (padded as FSDP2 pads shards,
    over the strategy's shard count: world, or `local` for the hybrid strategies)."""
    return sb.at_rest * shard_numel(params, dims, shards(strategy, world, local=local))
