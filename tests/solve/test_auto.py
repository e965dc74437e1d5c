"""auto_plan: never worse than a fitting baseline, fits, explains, fails cleanly."""
from __future__ import annotations

import re

import pytest

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.auto import InfeasibleBudget, auto_plan
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.build import make_plan
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator, least_memory
from shardsched.plan.spec import parse_strategy_spec
from shardsched.core.types import Optimizer, Plan, Precision, Strategy
from shardsched.errors import UsageError
from shardsched.profile.analytic import analytic_profile
from shardsched.models.spec import PRESETS

KW = dict(pins={}, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
CONFIGS = [("gpt2", 16, 8, "v100", 8, 1024), ("small", 8, 8, "cpu", 4, 256)]


def setup(preset, world, gpn, dev, mb, seq):
    prof = analytic_profile(PRESETS[preset], micro_batch=mb, seq=seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


def plan(prof, cl, budget, spec="auto", time_limit=10.0):
    return auto_plan(prof, cl, spec=parse_strategy_spec(spec), precision=Precision.BF16_MIXED,
                     optimizer=Optimizer.ADAM, memory_budget_bytes=budget, time_limit=time_limit)


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_never_worse_than_baselines(config):
    prof, cl = setup(*config)
    base = uniform_baselines(prof, cl, **KW)
    lo = min(Evaluator(p).peak(least_memory(p)) for p in candidate_problems(prof, cl, **KW))
    hi = max(s.peak for s in base) * 1.02
    ratios = []
    for k in range(5):
        budget = int(lo * (hi / lo) ** (k / 4))
        p = plan(prof, cl, budget)
        assert p.predicted.peak_bytes <= budget
        fitting = [s.seconds for s in base if s.peak <= budget]
        if fitting:
            assert p.predicted.step_seconds <= min(fitting) * (1 + 1e-12)
            ratios.append(p.predicted.step_seconds / min(fitting))
    assert ratios and min(ratios) < 1.0  # strictly better somewhere in the sweep


def test_infeasible_budget_names_the_smallest_that_fits():
    prof, cl = setup("small", 8, 8, "cpu", 4, 256)
    with pytest.raises(InfeasibleBudget) as e:
        plan(prof, cl, 1 << 20)
    msg = str(e.value)
    assert isinstance(e.value, UsageError) and "\n" not in msg
    need = int(re.search(r"needs (\d+) bytes", msg).group(1))
    assert re.search(r"dominated by (params|grads|optimizer|activations|comm_buffers)", msg)
    assert plan(prof, cl, need).predicted.peak_bytes <= need
    with pytest.raises(InfeasibleBudget):
        plan(prof, cl, need - 1)


def test_the_advised_budget_is_accepted():
    """Issue 27: the --memory-budget the message advises leaves, after the device's default
    headroom (5%+1GiB on GPUs), at least what the least-memory plan needs; the usable figure is
    said apart."""
    from shardsched.cost.bytes import parse_bytes
    from shardsched.cost.headroom import headroom_for, usable_budget

    prof, cl = setup("gpt2", 16, 8, "v100", 8, 1024)
    with pytest.raises(InfeasibleBudget) as e:
        plan(prof, cl, 1 << 30)
    msg = str(e.value)
    need = int(re.search(r"needs (\d+) bytes", msg).group(1))
    given = re.search(r"use --memory-budget (\S+) or more", msg).group(1)
    usable = usable_budget(parse_bytes(given), device_memory=cl.device.memory_bytes,
                           headroom=headroom_for(None, cl.device)).usable
    assert usable >= need and parse_bytes(given) > need  # a GPU keeps headroom
    assert "usable" in msg and "--headroom 5%+1GiB" in msg
    assert plan(prof, cl, usable).predicted.peak_bytes <= usable


def test_pins_notes_and_json():
    prof, cl = setup("small", 8, 8, "cpu", 4, 256)
    p = make_plan(prof, cl, strategy="auto,head=replicate,embed=full_shard", precision="bf16-mixed",
                  memory_budget_bytes=1 << 30)
    by_layer = {name: u.strategy for u in p.units for name in u.layers}
    assert by_layer["head"] is Strategy.REPLICATE and by_layer["embed"] is Strategy.FULL_SHARD
    assert p.solver.name in ("highs", "greedy") and p.notes
    assert any("replicate" in n for n in p.notes)
    assert Plan.from_json(p.to_json()) == p


def test_small_model_plans_fast_and_default_budget():
    prof, cl = setup("tiny", 8, 8, "cpu", 4, 128)
    p = plan(prof, cl, None)  # its speed: bench/bench_plan_speed.py (not a timed test)
    assert p.memory_budget_bytes is None and p.predicted.peak_bytes <= cl.device.memory_bytes
    assert p.solver.name == "highs" and p.solver.status == "optimal"
