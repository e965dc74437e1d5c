"""Baselines under the same cost model and budget as the planner.

Every uniform strategy as `build.make_plan` plans it (block-size fusion, FSDP2's
default one-ahead prefetch: `default_launch(ahead=1)`, two gather buffers in
forward), with the spec's pinned layers kept; and the greedy schedule. The auto
plan must never be slower than any of them that fits (tests/plan/test_auto.py).
"""
from __future__ import annotations

from typing import NamedTuple

from shardsched.cost.device import Cluster
from shardsched.cost.strategy import strategies_for
from shardsched.solve.candidates import Choice, Problem, block_params, problem_for
from shardsched.core.types import Checkpoint, Optimizer, Precision, Strategy
from shardsched.plan.units import group_layers, layer_strategies
from shardsched.profile.types import Profile
from shardsched.sim.memory import step_memory
from shardsched.sim.scenario import default_launch
from shardsched.sim.timeline import replay


class Scored(NamedTuple):
    """A schedule of one grouping with its simulated step time and peak."""

    name: str
    problem: Problem
    choice: Choice
    seconds: float
    peak: int


def score(name: str, p: Problem, ch: Choice) -> Scored:
    """Simulate a schedule (the ground truth every answer is judged by)."""
    sc = p.scenario(ch)
    return Scored(name, p, ch, replay(sc).step_seconds, max(m.total for m in step_memory(sc)))


def uniform(strategy: Strategy, profile: Profile, cluster: Cluster, *, pins: dict, precision: Precision,
            optimizer: Optimizer, checkpoint: Checkpoint | bool = False) -> Scored | None:
    """`make_plan(strategy=...)`'s plan: pins kept, block-size fusion, one-ahead prefetch
    (`checkpoint`: every unit but the root checkpointed, `--strategy STRATEGY+ckpt` or, selective,
    `STRATEGY+sac`; None for `+sac` where the profile does not say what selective keeps)."""
    checkpoint = Checkpoint(checkpoint)
    per_layer = layer_strategies(profile, [pins.get(layer.name) or strategy for layer in profile.layers])
    groups = group_layers(profile, per_layer, block_params=block_params(cluster, precision, optimizer))
    alist = [(layer, layer.name) for layer in profile.layers]
    p = problem_for(groups, alist, per_layer, profile=profile, cluster=cluster,
                    precision=precision, optimizer=optimizer)
    strats = tuple(per_layer[g[0]] for g in groups)
    fwd, bwd = default_launch(strats, ahead=1)
    if checkpoint is Checkpoint.SELECTIVE and not p.selective:
        return None
    ckpt = p.all_checkpointed() if checkpoint else ()
    if checkpoint is Checkpoint.SELECTIVE:
        ckpt = tuple(Checkpoint.SELECTIVE if c else False for c in ckpt)
    return score(config_name(strategy, checkpoint), p, Choice(strats, fwd, bwd, ckpt))


def config_name(strategy: Strategy, checkpoint: Checkpoint | bool) -> str:
    return strategy.label + Checkpoint(checkpoint).suffix


def uniform_configs(cluster: Cluster) -> list[tuple[Strategy, Checkpoint]]:
    """Every uniform configuration on this cluster: each strategy, with no, full (`+ckpt`) and
    selective (`+sac`) checkpointing (issue 27: the `+sac` words were missing)."""
    return [(s, c) for c in (Checkpoint.NONE, Checkpoint.FULL, Checkpoint.SELECTIVE) for s in strategies_for(cluster)]


def uniform_baselines(profile: Profile, cluster: Cluster, *, pins: dict, precision: Precision,
                      optimizer: Optimizer) -> list[Scored]:
    out = [uniform(s, profile, cluster, pins=pins, precision=precision, optimizer=optimizer, checkpoint=c)
           for s, c in uniform_configs(cluster)]
    return [s for s in out if s is not None]
