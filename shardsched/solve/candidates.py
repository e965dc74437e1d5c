"""Grouping candidates: which sequences of units the schedulers are asked to plan.

The MILP (`solve.milp`) is indexed by compute steps, and the number of steps
depends on the grouping, so grouping is decided outside it: every candidate
grouping below is scheduled (greedy, then MILP) and the fastest fitting one
wins. Candidates (DESIGN.md, "Vocabulary": fusion and partitioning):
- atoms: the profile's layers, or, for a layer larger than the block size that
  has children, its children (tensor partitioning: gathering half a block at a
  time halves the transient buffer, which buys fit at tight budgets);
- exhaustive: every composition of the atoms into consecutive units, when there
  are few atoms (2^(k-1) groupings; this is what `solve.brute` enumerates);
- otherwise pruned: no fusion; fusion up to the block size (as `build.make_plan`
  does); fusion beyond it while the fused AllGather costs < 1.2x the largest
  part's (latency-bound messages, the DeepCompile / ZeRO++ bucket rule); a
  larger unit costs memory and only pays when alpha dominates, so larger
  fusions are never candidates.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from typing import NamedTuple

from shardsched.cost.comm import Collective, block_size_bytes, collective_seconds
from shardsched.cost.device import Cluster
from shardsched.cost.memory import state_bytes
from shardsched.cost.strategy import strategies_for
from shardsched.plan.schedule import make_scenario
from shardsched.core.types import Checkpoint, GradSync, Optimizer, Precision, Strategy
from shardsched.plan.units import ROOT, root_strategy, unit_cost
from shardsched.plan.units import partition as partition_layer
from shardsched.profile.types import LayerProfile, Profile
from shardsched.sim.scenario import Scenario
from shardsched.sim.unit_cost import UnitCost

EXHAUSTIVE_ATOMS = 5
"""Up to this many atoms every grouping is a candidate (16 groupings)."""
FUSE_RATIO = 1.2


class Choice(NamedTuple):
    """Discrete decisions for one grouping: what the simulator replays."""

    strategies: tuple[Strategy, ...]
    fwd: tuple[int, ...]
    bwd: tuple[int | None, ...]
    ckpt: tuple = ()
    """Per unit: activation checkpointing, a bool (full or none) or a `Checkpoint` (empty: none)."""


class Problem(NamedTuple):
    """One grouping to schedule, with everything `make_scenario` needs."""

    costs: tuple[UnitCost, ...]
    allowed: tuple[tuple[Strategy, ...], ...]
    profile: Profile
    cluster: Cluster
    precision: Precision
    optimizer: Optimizer
    checkpointable: bool = False
    selective: tuple[UnitCost, ...] = ()
    """Each unit's selective form (`plan.units.unit_cost(..., Checkpoint.SELECTIVE)`): where
    given and `checkpointable`, solvers choose none, selective or full per unit; empty when
    the profile does not say what selective checkpointing keeps."""
    """Whether solvers may checkpoint units (a binary per unit, beside its strategy)."""
    accumulation: int = 1
    """Micro-batches per optimizer step (`Scenario.accumulation`)."""
    grad_sync: GradSync = GradSync.EVERY
    """When gradients are reduced under accumulation (`Scenario.grad_sync`)."""

    @property
    def n(self) -> int:
        return len(self.costs)

    def can_checkpoint(self, i: int) -> bool:
        """Whether unit i may be checkpointed: never the root ([Note: the root unit])."""
        return self.checkpointable and self.costs[i].layers != (ROOT,)

    def can_select(self, i: int) -> bool:
        """Whether unit i may be checkpointed selectively."""
        return bool(self.selective) and self.can_checkpoint(i)

    def checkpoint_modes(self, i: int) -> tuple:
        """Unit i's checkpointing choices as `Choice.ckpt` holds them: none and full as booleans
        (so choices compare equal across solvers), selective where offered; () where it may
        not be checkpointed."""
        if not self.can_checkpoint(i):
            return ()
        return (False, True, Checkpoint.SELECTIVE) if self.can_select(i) else (False, True)

    def all_checkpointed(self) -> tuple[bool, ...]:
        """Every unit that may be checkpointed, checkpointed (`STRATEGY+ckpt`)."""
        return tuple(self._replace(checkpointable=True).can_checkpoint(i) for i in range(self.n))

    def scenario(self, choice: Choice) -> Scenario:
        costs = [self.selective[i] if choice.ckpt and choice.ckpt[i] is Checkpoint.SELECTIVE else c
                 for i, c in enumerate(self.costs)]
        sc = make_scenario(costs, list(choice.strategies), choice.fwd, choice.bwd,
                           profile=self.profile, cluster=self.cluster,
                           precision=self.precision, optimizer=self.optimizer, checkpoint=choice.ckpt)
        if self.accumulation == 1:
            return sc
        return dataclasses.replace(sc, accumulation=self.accumulation, grad_sync=self.grad_sync)


def atoms(profile: Profile, *, block_params: int, partition: bool) -> list[tuple[LayerProfile, str]]:
    """(atom, owning layer) in execution order; large layers split into children."""
    out = []
    for layer in profile.layers:
        if partition and layer.children and layer.params > block_params:
            out += [(c, layer.name) for c in partition_layer(layer)]
        else:
            out.append((layer, layer.name))
    return out


BLOCK_MEMORY_SHARE = 32
"""A fused unit's gathered parameters stay under 1/32 of device memory."""


def block_params(cluster: Cluster, precision: Precision, optimizer: Optimizer) -> int:
    """Parameters per fused unit: enough to reach 90% of the AllGather's bandwidth
    (`block_size_bytes`), capped at 1/BLOCK_MEMORY_SHARE of device memory.

    [Note: why a memory cap] Flat rings pay (world-1) latencies per AllGather
    (`cost.comm`), so at 1024 workers the 90%-bandwidth block is tens of GB; FSDP2
    holds two or three gathered units at once (the current one, the prefetched one,
    and in backward their gradients), and fusion that fills memory with them is no
    plan a user would run."""
    cap = cluster.device.memory_bytes // BLOCK_MEMORY_SHARE
    return min(block_size_bytes(cluster), cap) // state_bytes(precision, optimizer).unsharded_param


def compositions(k: int):
    """Every split of range(k) into consecutive non-empty groups."""
    for cuts in itertools.product((False, True), repeat=max(0, k - 1)):
        groups, cur = [], [0]
        for i, cut in enumerate(cuts, start=1):
            if cut:
                groups.append(cur)
                cur = []
            cur.append(i)
        groups.append(cur)
        yield groups


def _ag_seconds(params: int, cluster: Cluster, unsharded: int) -> float:
    return collective_seconds(Collective.ALL_GATHER, params * unsharded, cluster)


def fuse(sizes: list[int], *, limit: int = 0, ratio: float = 0.0, cluster: Cluster | None = None,
         unsharded: int = 2, breaks: set[int] = frozenset()) -> list[list[int]]:
    """Greedy left-to-right fusion: below `limit` params, or while the fused
    AllGather costs < `ratio` x the largest part's. No group crosses a break."""
    groups: list[list[int]] = []
    for i, p in enumerate(sizes):
        if groups and i not in breaks:
            cur = sum(sizes[j] for j in groups[-1])
            fits = limit > 0 and cur < limit
            if ratio and cluster is not None:
                big = max(cur, p)
                fits = fits or (_ag_seconds(cur + p, cluster, unsharded)
                                < ratio * _ag_seconds(big, cluster, unsharded))
            if fits:
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def _allowed(pins: list[Strategy | None], cluster: Cluster) -> tuple[Strategy, ...] | None:
    """Strategies a unit of these atoms may take; None when pins conflict."""
    fixed = {p for p in pins if p is not None}
    if len(fixed) > 1:
        return None
    return tuple(fixed) if fixed else strategies_for(cluster)


def problem_for(groups: list[list[int]], atom_list, pins: list[Strategy | None], *, profile: Profile,
                cluster: Cluster, precision: Precision, optimizer: Optimizer) -> Problem | None:
    allowed = [_allowed([pins[i] for i in g], cluster) for g in groups]
    for k, g in enumerate(groups):  # the root unit stands alone and never reshards after forward
        if any(atom_list[i][0].name == ROOT for i in g):
            if len(g) > 1:
                return None
            allowed[k] = tuple(dict.fromkeys(root_strategy(s) for s in allowed[k])) if allowed[k] else None
    if any(a is None for a in allowed):
        return None
    costs = tuple(unit_cost([atom_list[i][0] for i in g]) for g in groups)
    return Problem(costs=costs, allowed=tuple(allowed), profile=profile, cluster=cluster,
                   precision=precision, optimizer=optimizer, selective=selective_costs(groups, atom_list))


def selective_costs(groups: list[list[int]], atom_list) -> tuple[UnitCost, ...]:
    """`Problem.selective`; empty when an atom's profile lacks what selective checkpointing keeps."""
    if any(atom_list[i][0].selective_saved_bytes is None for g in groups for i in g):
        return ()
    return tuple(unit_cost([atom_list[i][0] for i in g], Checkpoint.SELECTIVE) for g in groups)


def candidate_problems(profile: Profile, cluster: Cluster, *, pins: dict[str, Strategy | None],
                       precision: Precision, optimizer: Optimizer,
                       exhaustive_atoms: int = EXHAUSTIVE_ATOMS) -> list[Problem]:
    """Distinct groupings worth scheduling (see the module docstring)."""
    block = block_params(cluster, precision, optimizer)
    unsharded = state_bytes(precision, optimizer).unsharded_param
    kw = dict(profile=profile, cluster=cluster, precision=precision, optimizer=optimizer)
    out, seen = [], set()
    for partition in (False, True):
        alist = atoms(profile, block_params=block, partition=partition)
        names = tuple(a.name for a, _ in alist)
        if partition and names == tuple(layer.name for layer in profile.layers):
            continue  # nothing to partition
        apins = [pins.get(owner) for _, owner in alist]
        sizes = [a.params for a, _ in alist]
        breaks = {i for i in range(1, len(alist)) if apins[i] != apins[i - 1]}
        if len(alist) <= exhaustive_atoms:
            groupings = list(compositions(len(alist)))
        else:
            groupings = [[[i] for i in range(len(alist))],
                         fuse(sizes, limit=block, breaks=breaks),
                         fuse(sizes, limit=block, ratio=FUSE_RATIO, cluster=cluster,
                              unsharded=unsharded, breaks=breaks)]
        for g in groupings:
            key = tuple(tuple(names[i] for i in grp) for grp in g)
            if key in seen:
                continue
            seen.add(key)
            p = problem_for(g, alist, apins, **kw)
            if p is not None:
                out.append(p)
    return out


def finest_problem(profile: Profile, cluster: Cluster, *, pins: dict[str, Strategy | None],
                   precision: Precision, optimizer: Optimizer) -> Problem:
    """Smallest units: every large layer partitioned, nothing fused."""
    alist = atoms(profile, block_params=0, partition=True)
    apins = [pins.get(owner) for _, owner in alist]
    return problem_for([[i] for i in range(len(alist))], alist, apins, profile=profile,
                       cluster=cluster, precision=precision, optimizer=optimizer)


_ONCE: OrderedDict = OrderedDict()
ONCE_SIZE = 256
"""How many (Problem, function) results `once` keeps: the most recent."""


def once(p: Problem, fn):
    """`fn(p)` computed once per Problem object (issue 27: the budget ladder searches the same
    groupings at many budgets, and rebuilding `milp.costs_of` for every `Evaluator` and bound took
    a third of it). Keyed by identity, with a reference held so an id is never reused while kept: a
    Problem is immutable and `fn` reads nothing else, so a hit is exactly what a new call returns."""
    k = (id(p), fn)
    hit = _ONCE.get(k)
    if hit is not None and hit[0] is p:
        _ONCE.move_to_end(k)
        return hit[1]
    out = fn(p)
    _ONCE[k] = (p, out)
    if len(_ONCE) > ONCE_SIZE:
        _ONCE.popitem(last=False)
    return out
