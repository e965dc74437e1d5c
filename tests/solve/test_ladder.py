"""Issue 27, part 2: separate runs at budgets b < b' never give a slower plan at b'
(`solve.ladder`, [Note: the budget ladder]): random budget pairs, each planned on its own (at a tenth of
the default local work to keep it short: the argument holds at any effort; `plan`'s default
effort: tests/verify/test_cli_verify.py); the rungs are fixed by the model and cluster alone."""
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
from shardsched.solve.search import Effort

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
    # two budgets within one rung interval and the rung itself: the answers are equal there
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
