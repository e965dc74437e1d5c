"""The new levers (node-aware strategies, checkpointing) in the MILP against brute force and the simulator.

Two nodes of two workers, so hybrid_shard, hybrid_shard_grad_op and full_shard/node are offered;
layers whose inputs are smaller than their activations, so checkpointing buys memory.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from shardsched.cost.device import DEVICES, Cluster
from shardsched.cost.strategy import NODE_AWARE, strategies_for
from shardsched.core.types import Strategy
from shardsched.solve import milp
from shardsched.solve.brute import brute
from shardsched.solve.candidates import Choice, candidate_problems
from shardsched.solve.greedy import Evaluator, greedy, least_memory
from shardsched.sim.memory import step_memory
from shardsched.sim.timeline import replay

from tests.solve.test_milp_vs_brute import KW, check_rows_and_evaluator, random_choice, synth

CPU = dataclasses.replace(DEVICES["cpu"], unit_overhead_seconds=0.0)
# Inter-node link 20x slower than intra: node-aware strategies matter.
MULTI = Cluster(world=4, gpus_per_node=2, device=dataclasses.replace(CPU, overlap=True))
BLOCKING = Cluster(world=4, gpus_per_node=2, device=CPU)
FEW = (Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD)
"""For 3-unit groupings: brute force over all six strategies x checkpointing takes minutes."""


def problems(seed: int, cluster: Cluster):
    out = []
    for p in candidate_problems(synth(3, seed, ckpt_saves=True), cluster, **KW):
        p = p._replace(checkpointable=True)
        out.append(p if p.n < 3 else p._replace(allowed=(FEW,) * p.n))
    return out


def budgets(p) -> list[int]:
    ev = Evaluator(p)
    lo = ev.peak(least_memory(p))
    hi = ev.peak(Choice((Strategy.REPLICATE,) * p.n, tuple(range(p.n)), (None,) * p.n))
    return [lo + 1, int(lo + 0.1 * (hi - lo)), int(lo + 0.3 * (hi - lo)), hi]


def test_offered_only_across_nodes():
    assert set(NODE_AWARE) <= set(strategies_for(MULTI))
    assert not set(NODE_AWARE) & set(strategies_for(Cluster(world=8, gpus_per_node=8, device=CPU)))


@pytest.mark.parametrize("seed,cluster", [(0, MULTI), (1, BLOCKING)], ids=["overlap", "blocking"])
def test_milp_equals_brute_force_with_levers(seed, cluster):
    used = set()
    for p in problems(seed, cluster):
        for budget in budgets(p):
            b = brute(p, budget=budget)
            r = milp.solve(p, budget=budget)
            assert r.objective == pytest.approx(b.seconds, rel=1e-9)
            s = replay(p.scenario(r.choice)).step_seconds
            assert s == pytest.approx(b.seconds, rel=1e-9)
            assert max(m.total for m in step_memory(p.scenario(r.choice))) <= budget
            used |= set(b.choice.strategies) | ({"ckpt"} if any(b.choice.ckpt) else set())
    # The levers are exercised, not just offered: the optimum uses some of them.
    assert used & ({"ckpt"} | set(NODE_AWARE))


@pytest.mark.parametrize("cluster", [MULTI, BLOCKING], ids=["overlap", "blocking"])
def test_memory_rows_times_and_evaluator_match_simulator(cluster):
    r = random.Random(11)
    for p in candidate_problems(synth(5, 5, ckpt_saves=True), cluster, **KW)[:5]:
        p = p._replace(checkpointable=True)
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(20):
            check_rows_and_evaluator(p, b, ev, random_choice(p, r))


def test_greedy_start_is_feasible_and_milp_never_worse():
    for p in problems(2, MULTI):
        for budget in budgets(p):
            start = greedy(p, budget=budget)
            t0 = replay(p.scenario(start)).step_seconds
            r = milp.solve(p, budget=budget, start=start, start_seconds=t0)
            assert replay(p.scenario(r.choice)).step_seconds <= t0 * (1 + 1e-12)
            assert max(m.total for m in step_memory(p.scenario(r.choice))) <= budget
