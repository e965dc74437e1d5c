"""More memory never makes the plan slower: 12 budgets on 3 configurations.

One compute-bound (one node of fast links, micro-batch 8) and two communication-bound
multi-node configurations (many nodes, micro-batch 1): the step time of the auto plan
is non-increasing in the budget and never above a uniform configuration that fits."""
from __future__ import annotations

import pytest

from shardsched.core.types import Optimizer, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import parse_model_spec
from shardsched.profile.analytic import analytic_profile
from shardsched.tradeoff.sweep import auto_budgets, sweep

KW = dict(precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
CONFIGS = {  # model, world, gpus per node, device, micro-batch
    "compute-bound": ("gpt:layers=4,hidden=1024,heads=16,vocab=32000,seq=1024", 8, 8, "h100", 8),
    "comm-bound-256": ("gpt:layers=4,hidden=2048,heads=16,vocab=32000,seq=512", 256, 8, "a100", 1),
    "comm-bound-64": ("gpt:layers=4,hidden=2048,heads=16,vocab=32000,seq=256", 64, 8, "v100", 1),
}


def setup(model, world, gpn, dev, mb):
    cfg = parse_model_spec(model).config
    prof = analytic_profile(cfg, micro_batch=mb, seq=cfg.seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_step_time_never_rises_with_the_budget(name):
    prof, cl = setup(*CONFIGS[name])
    budgets = auto_budgets(prof, cl, n=12, **KW)
    points = sweep(prof, cl, budgets, **KW)
    steps = [p.auto.predicted.step_seconds for p in points]
    assert all(p.auto is not None and p.auto.predicted.peak_bytes <= p.budget for p in points)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), steps
    for p in points:
        fitting = [s.seconds for s in p.uniform.values() if s.peak <= p.budget]
        assert p.auto.predicted.step_seconds <= min(fitting, default=float("inf")) * (1 + 1e-12)
    assert steps[-1] < steps[0]  # the budgets matter: the sweep is not flat
