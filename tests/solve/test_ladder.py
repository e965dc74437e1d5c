"""Issue 27, part 2: separate runs at budgets b < b' never give a slower plan at b'
(`solve.ladder`, [Note: the budget ladder]); random budget pairs, each planned on its own."""
from __future__ import annotations

import random

from shardsched.core.types import Optimizer, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import parse_model_spec
from shardsched.plan.spec import parse_strategy_spec
from shardsched.profile.analytic import analytic_profile
from shardsched.solve.auto import declared_space
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.ladder import least_memory_floor, ladder_plan
from shardsched.solve.search import Effort

KW = dict(precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)


def test_more_budget_never_gives_a_slower_plan():
    rng = random.Random(27)
    # the guarantee holds for any work limit: a small one keeps the test short
    effort = Effort(nodes=10, local_work=20_000)
    for model, world, gpn, dev in [("gpt:layers=3,hidden=1024,heads=16,vocab=16000,seq=1024", 64, 4, "h100")]:
        cfg = parse_model_spec(model).config
        prof = analytic_profile(cfg, micro_batch=1, seq=cfg.seq, device=DEVICES[dev])
        cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])
        spec = parse_strategy_spec("auto")
        lo = least_memory_floor(declared_space(prof, cl, spec=spec, **KW)[1])
        hi = max(s.peak for s in uniform_baselines(prof, cl, pins={}, **KW))
        for _ in range(2):
            b, b2 = sorted(rng.randrange(lo, hi) for _ in range(2))
            small = ladder_plan(prof, cl, spec=spec, memory_budget_bytes=b, effort=effort, **KW)
            large = ladder_plan(prof, cl, spec=spec, memory_budget_bytes=b2, effort=effort, **KW)
            assert small.predicted.peak_bytes <= b and large.predicted.peak_bytes <= b2
            assert large.predicted.step_seconds <= small.predicted.step_seconds, (b, b2)
            assert large.solver.bound <= large.predicted.step_seconds
