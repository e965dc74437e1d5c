"""Plan <-> Scenario: prefetch lists are the schedule, written FSDP2's way.

A unit listed in unit j's `forward_prefetch` has its forward AllGather launched
at the start of j's forward (step j); listed in j's `backward_prefetch`, its
backward AllGather is launched at the start of j's backward (step 2n-1-j).
Unlisted, a unit gathers at its own step (no prefetch).
"""
from __future__ import annotations

import dataclasses

from shardsched.cost.device import Cluster
from shardsched.cost.memory import state_bytes
from shardsched.cost.strategy import shard_count
from shardsched.core.types import Plan, Unit
from shardsched.plan.units import partition, unit_cost
from shardsched.profile.types import Profile
from shardsched.sim.scenario import Scenario
from shardsched.sim.unit_cost import UnitCost

# Foreach Adam/SGD materialise about this many parameter-sized temporaries
# (measured with FSDPMemTracker on CPU, tests/plan/test_memory_vs_fsdp2.py).
OPTIMIZER_WORKSPACE_FACTOR = {"adam": 1.0, "sgd": 1.0}


def _by_name(layers) -> dict:
    """Layers and their children as a partition's units take them (`plan.units.partition`)."""
    out = {}
    for layer in layers:
        out[layer.name] = layer
        if layer.children:
            out.update(_by_name(partition(layer)))
    return out


def unit_costs(plan: Plan, profile: Profile) -> list[UnitCost]:
    by_name = _by_name(profile.layers)
    missing = [n for u in plan.units for n in u.layers if n not in by_name]
    if missing:
        raise ValueError(f"plan names layers the profile lacks: {missing[:3]}")
    return [unit_cost([by_name[n] for n in u.layers], u.checkpoint) for u in plan.units]


def scenario_for(plan: Plan, profile: Profile, cluster: Cluster) -> Scenario:
    costs = unit_costs(plan, profile)
    n, index = len(plan.units), {u.name: i for i, u in enumerate(plan.units)}
    fwd = list(range(n))
    bwd: list[int | None] = [2 * n - 1 - i if u.strategy.gathers_for_backward else None
                             for i, u in enumerate(plan.units)]
    for j, u in enumerate(plan.units):
        for name in u.forward_prefetch:
            fwd[index[name]] = min(fwd[index[name]], j)
        for name in u.backward_prefetch:
            i = index[name]
            if bwd[i] is not None:
                bwd[i] = min(bwd[i], 2 * n - 1 - j)
    sc = make_scenario(costs, [u.strategy for u in plan.units], fwd, bwd, plan=plan,
                       profile=profile, cluster=cluster, checkpoint=[u.checkpoint for u in plan.units])
    return dataclasses.replace(sc, accumulation=plan.accumulation, grad_sync=plan.grad_sync)


def optimizer_seconds_per_param(sb, cluster: Cluster) -> float:
    """The optimizer step is memory-bound: it reads and writes every persistent byte."""
    return sb.at_rest * 2 / cluster.device.optimizer_bytes_per_second


# [Note: host time per op]
# The host dispatches every operator of a layer's forward and backward (Python, the dispatcher,
# a kernel launch) and FSDP2's hooks per unit and per parameter tensor. On a CPU it is the
# device, and the time is paid in line: compute + host. A GPU's kernels run asynchronously, so
# the host hides behind them until it is the slower: each unit's forward, backward and
# recomputation take max(kernels, host). Measured on one H200 (`cost.device.GPU_HOST`): a
# Llama layer's 76 forward operators cost 5.1 ms of host time forward and backward, more than
# its kernels at 1 x 2048 tokens (the 1.1B model's steps there ran 3.9x the kernels' time),
# and selective checkpointing's dispatch modes add 5.5 ms (its steps ran 1.8-2.0x the
# kernels' time at 8K-16K tokens, slower than full checkpointing). Per forward operator
# (`UnitCost.forward_ops`): a third of `op_host_seconds` in forward, two thirds in backward
# (autograd runs about two operators per forward one); `recompute_op_host_seconds` per
# recomputed operator, plus `sac_op_host_seconds` when selective (counted with the
# recomputation: the step's total is the same). DDP pays no FSDP2 host work.
FORWARD_HOST_SHARE = 1 / 3


def with_host_overhead(c, cluster: Cluster, *, fsdp: bool = True):
    """A unit's cost with the host's time on it ([Note: host time per op]): FSDP2's per unit
    and per parameter tensor (`fsdp`), split over its forward and backward, and per operator.
    In the units' compute, not the optimizer's, so the MILP (which reads these seconds) and
    the simulator price it alike."""
    dev = cluster.device
    half = (dev.unit_overhead_seconds + dev.tensor_overhead_seconds * len(c.dims)) / 2 if fsdp else 0.0
    dispatch = c.forward_ops * dev.op_host_seconds
    host_f, host_b = half + dispatch * FORWARD_HOST_SHARE, half + dispatch * (1 - FORWARD_HOST_SHARE)
    host_r = c.forward_ops * (dev.recompute_op_host_seconds + (dev.sac_op_host_seconds if c.selective else 0.0))
    if not (host_f or host_b or host_r):
        return c
    join = max if dev.overlap else (lambda kernels, host: kernels + host)
    # full checkpointing recomputes the forward as priced (None) unless the host prices it apart
    rec = join(c.recompute(), host_r) if host_r or c.recompute_seconds is not None else None
    return dataclasses.replace(c, forward_seconds=join(c.forward_seconds, host_f),
                               backward_seconds=join(c.backward_seconds, host_b), recompute_seconds=rec)


def optimizer_scalar_bytes(costs, optimizer, cluster: Cluster) -> int:
    """`Scenario.optimizer_scalar_bytes`: Adam's per-tensor `step` when it is device memory."""
    if optimizer.value != "adam" or cluster.device.name != "cpu":
        return 0
    return 4 * sum(len(c.dims) for c in costs)


def make_scenario(costs, strategies, fwd, bwd, *, plan: Plan | None = None, profile: Profile,
                  cluster: Cluster, precision=None, optimizer=None, checkpoint=()) -> Scenario:
    precision = precision or plan.precision
    optimizer = optimizer or plan.optimizer
    sb = state_bytes(precision, optimizer)
    shard_params = sum(c.shard_numel(shard_count(s, cluster)) for c, s in zip(costs, strategies))
    opt_seconds = shard_params * optimizer_seconds_per_param(sb, cluster)
    sc = Scenario(units=tuple(costs), strategies=tuple(strategies), forward_launch=tuple(fwd),
                  backward_launch=tuple(bwd), cluster=cluster, state=sb,
                  input_bytes=profile.input_bytes, optimizer_seconds=opt_seconds,
                  optimizer_workspace_factor=OPTIMIZER_WORKSPACE_FACTOR[optimizer.value],
                  optimizer_scalar_bytes=optimizer_scalar_bytes(costs, optimizer, cluster),
                  buffer_bytes=profile.buffer_bytes, loss_bytes=profile.loss_bytes,
                  checkpoint=tuple(checkpoint) if any(checkpoint) else (),
                  root_tied_numel=profile.root_tied_numel)
    # A plan DDP runs (`Scenario.on_ddp`) pays none of FSDP2's host work. The MILP prices
    # every choice with it; `auto` still picks an all-replicate plan when it is fastest,
    # since its final choice is by the simulator.
    sc = dataclasses.replace(sc, units=tuple(with_host_overhead(c, cluster, fsdp=not sc.on_ddp) for c in sc.units))
    return sc.with_inputs_kept_before()


def units_with_schedule(sc: Scenario) -> tuple[Unit, ...]:
    """The Plan's units for a scenario: strategies plus prefetch lists."""
    n = sc.n
    fwd_lists: list[list[str]] = [[] for _ in range(n)]
    bwd_lists: list[list[str]] = [[] for _ in range(n)]
    for i in range(n):  # lists in use order: forward ascending, backward descending
        if sc.forward_launch[i] != i:
            fwd_lists[sc.forward_launch[i]].append(sc.units[i].name)
    for i in reversed(range(n)):
        bl = sc.backward_launch[i]
        if bl is not None and bl != sc.b_step(i):
            bwd_lists[2 * n - 1 - bl].append(sc.units[i].name)
    return tuple(Unit(name=c.name, layers=c.layers, strategy=s, params=c.params,
                      forward_prefetch=tuple(fwd_lists[i]), backward_prefetch=tuple(bwd_lists[i]),
                      checkpoint=sc.mode(i))
                 for i, (c, s) in enumerate(zip(sc.units, sc.strategies)))
