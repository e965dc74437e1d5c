"""Issue 27, part 2: separate runs at budgets b < b' never give a slower plan at b'
(`solve.ladder`, [Note: the budget ladder]): random budget pairs, each planned on its own (at a tenth of
the default local work to keep it short: the argument holds at any effort; `plan`'s default
effort: tests/verify/test_cli_verify.py); the rungs are fixed by the model and cluster alone; the
ascent's chain up to b is the chain up to b' cut short ([Note: the ascent]); the answer is never
slower than the exact optimum of a small grouping at b (HiGHS to completion)."""
from __future__ import annotations

import random

import pytest

from shardsched.core.types import Optimizer, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import parse_model_spec
from shardsched.plan.spec import parse_strategy_spec
from shardsched.profile.analytic import analytic_profile
from shardsched.solve.auto import declared_space
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.ladder import RATIO, ladder_plan, least_memory_floor, rungs
from shardsched.solve import milp
from shardsched.solve.ascent import ascend
from shardsched.solve.effort import ahead_for
from shardsched.solve.greedy import Evaluator
from shardsched.solve.search import Effort, prefetched_least

KW = dict(precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
EFFORT = Effort(local_work=40_000)
CONFIGS = [("gpt:layers=3,hidden=1024,heads=16,vocab=16000,seq=1024", 64, 4, "h100"),
           ("gpt:layers=6,hidden=2048,heads=16,vocab=32000,seq=2048,mlp=swiglu", 128, 8, "a100")]


def _setup(model: str, world: int, gpn: int, dev: str):
    cfg = parse_model_spec(model).config
    prof = analytic_profile(cfg, micro_batch=1, seq=cfg.seq, device=DEVICES[dev])
    cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])
    spec = parse_strategy_spec("auto")
    lo = least_memory_floor(declared_space(prof, cl, spec=spec, **KW)[1])
    hi = max(s.peak for s in uniform_baselines(prof, cl, pins={}, **KW))
    return prof, cl, spec, lo, hi


@pytest.mark.parametrize("config", CONFIGS, ids=["gpt3L", "llama6L"])
def test_more_budget_never_gives_a_slower_plan(config):
    prof, cl, spec, lo, hi = _setup(*config)
    rng = random.Random(27)
    budgets = sorted({rng.randrange(lo, hi) for _ in range(4)} | {lo, hi})
    # the rung itself and budgets within one rung interval (the ascent's points between)
    r = rungs(lo, hi)[1]
    budgets = sorted(set(budgets) | {r, r + 1, min(hi, int(r * RATIO) - 1)})
    plans = {b: ladder_plan(prof, cl, spec=spec, memory_budget_bytes=b, effort=EFFORT, **KW) for b in budgets}
    for b in budgets:
        assert plans[b].predicted.peak_bytes <= b
        assert plans[b].solver.bound <= plans[b].predicted.step_seconds
    # every pair drawn (each plan a separate call): more budget, never slower
    for b, b2 in zip(budgets, budgets[1:]):
        assert plans[b2].predicted.step_seconds <= plans[b].predicted.step_seconds, (b, b2)


def test_rungs_do_not_depend_on_the_budget():
    assert rungs(100, 1000) == rungs(100, 2000)[:len(rungs(100, 1000))]
    assert all(b / a <= RATIO for a, b in zip(rungs(100, 1000), rungs(100, 1000)[1:]))


def test_the_chain_up_to_a_budget_is_the_longer_chain_cut_short():
    prof, cl, spec, lo, hi = _setup(*CONFIGS[1])
    p = max(declared_space(prof, cl, spec=spec, **KW)[1], key=lambda q: q.n)
    ch, top = prefetched_least(p), 2 * lo
    full = ascend(p, ch, top=top, evals=200_000)
    assert len(full) > 3
    ev = Evaluator(p)
    for a, b in zip(full, full[1:]):  # each point faster, fitting the top, scored as greedy scores it
        assert b.seconds < a.seconds and b.peak <= top
        assert (ev.seconds(b.choice), ev.peak(b.choice)) == (b.seconds, b.peak)
    for stop in sorted({pt.peak for pt in full})[:-1]:
        cut = ascend(p, ch, top=top, evals=200_000, stop=stop)
        first_above = next(i for i, pt in enumerate(full) if pt.peak > stop)
        assert cut == full[:first_above + 1]


@pytest.mark.parametrize("config", CONFIGS, ids=["gpt3L", "llama6L"])
def test_never_slower_than_a_small_groupings_exact_optimum(config):
    prof, cl, spec, lo, hi = _setup(*config)
    problems = declared_space(prof, cl, spec=spec, **KW)[1]
    b = (lo + hi) // 2
    plan = ladder_plan(prof, cl, spec=spec, memory_budget_bytes=b, effort=EFFORT, **KW)
    small = [p for p in problems if p.n <= EFFORT.light_units]
    assert small
    for p in small:
        r = milp.solve(p, budget=b, ahead=ahead_for(p.n), nodes=10 ** 9)
        assert r.status == "optimal"
        assert plan.predicted.step_seconds <= r.objective * (1 + 1e-9)
