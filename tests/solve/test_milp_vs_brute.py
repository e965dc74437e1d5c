"""The MILP against brute force and the simulator, on small synthetic instances."""
from __future__ import annotations

import dataclasses
import random

import pytest

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve import milp
from shardsched.solve.auto import auto_plan
from shardsched.solve.baselines import score
from shardsched.solve.brute import brute_all
from shardsched.solve.candidates import Choice, candidate_problems
from shardsched.solve.greedy import Evaluator, greedy, least_memory
from shardsched.plan.spec import parse_strategy_spec
from shardsched.core.types import GradSync, Optimizer, Precision, Strategy
from shardsched.profile.types import LayerProfile, Profile
from shardsched.sim.memory import step_memory
from shardsched.sim.timeline import replay

KW = dict(pins={}, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
CLUSTER = Cluster(world=8, gpus_per_node=8, device=DEVICES["cpu"])
# The same links with communication beside compute (as NCCL on GPUs): the
# timing where launch points matter. DEVICES["cpu"] blocks (gloo).
OVERLAP = Cluster(world=8, gpus_per_node=8,
                  device=dataclasses.replace(DEVICES["cpu"], overlap=True, unit_overhead_seconds=0.0))


def synth(k: int, seed: int, *, ckpt_saves: bool = False) -> Profile:
    """Varied sizes and times; AllGathers (2 GB/s) comparable to compute, so choices matter.
    Unless `ckpt_saves`, a layer's inputs are as large as its activations, so checkpointing
    (which auto always may choose) never pays and the strategy-only brute force is the optimum."""
    r = random.Random(seed)
    layers = []
    for i in range(k):
        act = r.randint(1, 60) * 10**6
        layers.append(LayerProfile(name=f"l{i}", params=r.choice([1, 3, 8]) * r.randint(1, 6) * 10**6,
                                   forward_seconds=r.uniform(2, 15) * 1e-3, backward_seconds=r.uniform(4, 30) * 1e-3,
                                   activation_bytes=act, input_bytes=act // r.randint(3, 8) if ckpt_saves else act))
    return Profile(model="synth", layers=tuple(layers), fingerprint="synth", input_bytes=4096)


def random_choice(p, r: random.Random) -> Choice:
    st = tuple(r.choice(p.allowed[i]) for i in range(p.n))
    fwd = tuple(r.randint(0, i) for i in range(p.n))
    bwd = tuple(r.randint(p.n, 2 * p.n - 1 - i) if s.gathers_for_backward else None for i, s in enumerate(st))
    ckpt = tuple(r.random() < 0.5 for _ in range(p.n)) if p.checkpointable else ()
    return Choice(st, fwd, bwd, ckpt if any(ckpt) else ())


def budgets(problems) -> list[int]:
    lo = min(Evaluator(p).peak(least_memory(p)) for p in problems)
    hi = max(Evaluator(p).peak(Choice((Strategy.REPLICATE,) * p.n, tuple(range(p.n)), (None,) * p.n))
             for p in problems)
    return [lo + 1, int(lo + 0.15 * (hi - lo)), int(lo + 0.4 * (hi - lo))]


@pytest.mark.parametrize("cluster", [OVERLAP, CLUSTER], ids=["overlap", "blocking"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_milp_equals_brute_force(seed, cluster):
    prof = synth(4, seed)
    problems = candidate_problems(prof, cluster, **KW)
    assert len(problems) == 8  # every grouping of 4 layers
    for budget in budgets(problems):
        _, b = brute_all(problems, budget=budget)
        best = min((milp.solve(p, budget=budget) for p in problems), key=lambda r: r.objective)
        assert best.objective == pytest.approx(b.seconds, rel=1e-9)
        plan = auto_plan(prof, cluster, spec=parse_strategy_spec("auto"), memory_budget_bytes=budget,
                         precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM, time_limit=20)
        assert plan.predicted.step_seconds == pytest.approx(b.seconds, rel=1e-9)
        assert plan.predicted.peak_bytes <= budget


@pytest.mark.parametrize("cluster", [OVERLAP, CLUSTER], ids=["overlap", "blocking"])
@pytest.mark.parametrize("seed", [3, 4])
def test_objective_equals_replay_and_fits(seed, cluster):
    prof = synth(5, seed)
    for p in candidate_problems(prof, cluster, **KW)[:6]:
        for budget in budgets([p]):
            start = greedy(p, budget=budget)
            r = milp.solve(p, budget=budget, start=start, start_seconds=score("g", p, start).seconds)
            s = score("highs", p, r.choice)
            assert r.objective == pytest.approx(s.seconds, rel=1e-9)
            assert s.peak <= budget
            assert s.seconds <= score("g", p, start).seconds * (1 + 1e-12)


# Collectives that hold a quarter of the compute beside them (`DeviceSpec.comm_sm_share`; an H100's
# NCCL AllGather holds 24 of 132 SMs): the MILP's objective prices it ([Note: collectives slow the
# compute beside them] in sim/timeline.py).
SHARED = Cluster(world=8, gpus_per_node=8, device=dataclasses.replace(OVERLAP.device, comm_sm_share=0.25))


@pytest.mark.parametrize("seed", [0, 1])
def test_milp_prices_the_sm_share_as_brute_force(seed):
    """Objective == brute force == replay with compute slowed beside collectives, and the share
    moves the answer (the step is not the unslowed one)."""
    problems = candidate_problems(synth(4, seed), SHARED, **KW)
    plain = candidate_problems(synth(4, seed), OVERLAP, **KW)
    for budget in budgets(problems):
        _, b = brute_all(problems, budget=budget)
        solved = [milp.solve(p, budget=budget) for p in problems]
        best = min(solved, key=lambda r: r.objective)
        assert best.objective == pytest.approx(b.seconds, rel=1e-9)
        assert b.seconds > brute_all(plain, budget=budget)[1].seconds * (1 + 1e-6)
        for p, r in zip(problems, solved):  # the search's bound stays one (`milp.lower_bound`)
            assert milp.lower_bound(p, budget) <= r.objective * (1 + 1e-9)
    r = random.Random(seed)
    for p in problems[:3]:
        bld, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(10):
            check_rows_and_evaluator(p, bld, ev, random_choice(p, r))


def test_memory_rows_and_evaluator_match_simulator():
    r = random.Random(7)
    for p in candidate_problems(synth(5, 5), CLUSTER, **KW)[:5]:
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(20):
            check_rows_and_evaluator(p, b, ev, random_choice(p, r))


@pytest.mark.parametrize("accumulation, sync", [(2, GradSync.LAST), (3, GradSync.LAST), (2, GradSync.EVERY)])
def test_memory_rows_and_evaluator_match_simulator_accumulating(accumulation, sync):
    """Accumulating 2 under `last` a backward step holds the first micro-batch's gradients or the
    last's (two rows in the MILP, [Note: accumulation memory]); 3, the middle one's."""
    r = random.Random(accumulation)
    for p in candidate_problems(synth(5, 5), CLUSTER, **KW)[:4]:
        p = p._replace(accumulation=accumulation, grad_sync=sync)
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(10):
            check_rows_and_evaluator(p, b, ev, random_choice(p, r))


def check_rows_and_evaluator(p, b, ev, ch: Choice) -> None:
    """The MILP's memory rows and start times, and greedy's evaluator, against the simulator."""
    sim = [m.total for m in step_memory(p.scenario(ch))]
    assert [int(m) for m in ev.moments(ch)] == sim
    x = b.start(ch)
    rows = [0.0] * len(sim)
    for s, terms, const, gate in b.mem_rows:
        if gate is None or sum(x[g] for g in gate) > 0.5:
            rows[s] = max(rows[s], const + sum(c * x[k] for k, c in terms.items()))
    assert [v * milp.GiB for v in rows] == pytest.approx(sim, abs=64)
    objective = b.m.offset + sum(c * v for c, v in zip(b.m.cost, x))  # E[2n], and the share's term
    assert objective * b.tscale == pytest.approx(replay(p.scenario(ch)).step_seconds, rel=1e-12)


def test_memory_rows_and_evaluator_match_simulator_with_a_tied_head_between_layers():
    """A root owning a tied tensor whose gradient the code after layer 2 of 5 makes (a loss and
    tied head between layers, what it saved and its backward workspace): the moments before hold
    none of it ([Note: where the root's tied gradient appears] in profile/trace.py), in the MILP's
    rows and greedy's evaluator as in the simulator, whether layer 2 ends its unit or not."""
    base = synth(5, 5)
    root = LayerProfile(name="", params=4 * 10**6, forward_seconds=1e-3, backward_seconds=2e-3,
                        activation_bytes=10**6)
    layers = list(base.layers)
    layers[2] = dataclasses.replace(layers[2], makes_tied_grad=True, outside_bytes=20 * 10**6,
                                    outside_workspace_bytes=40 * 10**6,
                                    activation_bytes=layers[2].activation_bytes + 20 * 10**6)
    prof = dataclasses.replace(base, layers=(root, *layers), root_tied_numel=4 * 10**6)
    problems = candidate_problems(prof, CLUSTER, **KW)
    late = [p for p in problems if any(c.tied_late for c in p.costs)]
    ends = [p for p in problems if not any(c.tied_late for c in p.costs)]
    assert late and ends
    r = random.Random(11)
    for p in late[:4] + ends[:2]:
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(15):
            check_rows_and_evaluator(p, b, ev, random_choice(p, r))
