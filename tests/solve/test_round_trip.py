"""Issue 27: an auto plan's `strategy_spec` is a `--strategy` that gives the same plan back.

Split layers (`head.out`, `blocks.N.attn`), fused units, checkpointing and launch points
included ([Note: exact specs] in plan/spec.py), at budgets from the least-memory plan's peak
(where layers are split) to where everything fits."""
from __future__ import annotations

import pytest

from shardsched.core.types import Optimizer, Plan, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.errors import UsageError
from shardsched.models.spec import parse_model_spec
from shardsched.plan.spec import parse_strategy_spec
from shardsched.profile.analytic import analytic_profile
from shardsched.solve.auto import auto_plan, least_memory_peak
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.build import make_plan

KW = dict(precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
CONFIGS = {  # model, world, gpus per node, device
    "gpt-4L-a100-64": ("gpt:layers=4,hidden=2048,heads=16,vocab=32000,seq=512", 64, 8, "a100"),
    "gpt-6L-h100-16": ("gpt:layers=6,hidden=1024,heads=16,vocab=50000,seq=1024", 16, 4, "h100"),
    "tiny-cpu": ("tiny", 8, 8, "cpu"),
}


def setup(model, world, gpn, dev):
    cfg = parse_model_spec(model).config
    prof = analytic_profile(cfg, micro_batch=1, seq=cfg.seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


def same(a: Plan, b: Plan) -> None:
    assert [(u.layers, u.strategy, u.checkpoint, u.forward_prefetch, u.backward_prefetch) for u in a.units] == \
        [(u.layers, u.strategy, u.checkpoint, u.forward_prefetch, u.backward_prefetch) for u in b.units]
    assert a.predicted.step_seconds == b.predicted.step_seconds
    assert a.predicted.peak_bytes == b.predicted.peak_bytes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_auto_plans_write_back_as_a_strategy(name):
    prof, cl = setup(*CONFIGS[name])
    lo = least_memory_peak(prof, cl, **KW)
    hi = max(s.peak for s in uniform_baselines(prof, cl, pins={}, **KW))
    seen_split = False
    for k in range(4):
        budget = int(lo + (hi - lo) * k / 3)
        plan = auto_plan(prof, cl, spec=parse_strategy_spec("auto"), memory_budget_bytes=budget, **KW)
        spec = plan.strategy_spec
        assert spec and not parse_strategy_spec(spec).auto
        again = make_plan(prof, cl, strategy=spec, memory_budget_bytes=budget, **KW)
        same(plan, again)
        assert again.predicted.peak_bytes <= budget
        assert Plan.from_json(plan.to_json()).strategy_spec == spec
        seen_split |= any(name not in {layer.name for layer in prof.layers} for u in plan.units for name in u.layers)
    if name != "tiny-cpu":
        assert seen_split  # the least-memory budget splits layers into their children


def test_exact_specs_name_children_ranges_the_root_and_launches():
    prof, cl = setup("gpt:layers=3,hidden=512,heads=8,vocab=8000,seq=256", 16, 8, "a100")
    p = make_plan(prof, cl, strategy="full_shard@1,head.out=shard_grad_op+sac@0/-,blocks.0..blocks.1=replicate@1,"
                                     "blocks.2.attn=full_shard+ckpt@2/3", **KW)
    units = {u.name: u for u in p.units}
    assert "head.out" in units and "head.ln" in units and "blocks.2.attn" in units
    assert units["blocks.0..blocks.1"].layers == ("blocks.0", "blocks.1")
    assert str(units["head.out"].checkpoint.suffix) == "+sac"
    with pytest.raises(UsageError):
        make_plan(prof, cl, strategy="full_shard@1,blocks.0..blocks.1=replicate,blocks.1..blocks.2=replicate", **KW)
    with pytest.raises(UsageError):
        make_plan(prof, cl, strategy="full_shard,embed=replicate@9/1", **KW)
    with pytest.raises(UsageError):
        parse_strategy_spec("auto,embed=replicate@1")
