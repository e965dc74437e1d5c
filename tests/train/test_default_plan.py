"""The embedded default (`shardsched train` with no arguments) plans
automatically under a budget that forces a mixed plan (strategies, or
activation checkpointing on some units), and says why."""
from shardsched.train.config import TrainConfig
from shardsched.train.task import build
from shardsched.train.planning import make_local_plan


def test_default_plan_mixes_strategies_within_its_budget():
    cfg = TrainConfig()
    plan = make_local_plan(cfg, build(cfg, world=2), world=2)
    options = {(u.strategy, u.checkpoint) for u in plan.units}
    print([(u.name, u.strategy.value, u.checkpoint) for u in plan.units], plan.notes)
    assert len(options) >= 2, options
    assert plan.predicted.peak_bytes <= plan.memory_budget_bytes
    # the summary says which units got which option, and why
    assert any("fits;" in n or "frees its" in n for n in plan.notes)
    assert any("checkpointed" in n or "full_shard" in n for n in plan.notes)
    assert any("default memory budget" in n for n in plan.notes)
