"""The embedded default (`shardsched train` with no arguments) plans
automatically under a budget that forces a mixed plan, and says why."""
from shardsched.core.types import Strategy
from shardsched.train.config import TrainConfig
from shardsched.train.task import build
from shardsched.train.planning import make_local_plan


def test_default_plan_mixes_strategies_within_its_budget():
    cfg = TrainConfig()
    plan = make_local_plan(cfg, build(cfg, world=2), world=2)
    strategies = {u.strategy for u in plan.units}
    print([(u.name, u.strategy.value) for u in plan.units], plan.notes)
    assert Strategy.FULL_SHARD in strategies and len(strategies) >= 2
    assert plan.predicted.peak_bytes <= plan.memory_budget_bytes
    # the summary says which units got which strategy, and why
    assert any("full_shard (frees its" in n for n in plan.notes)
    assert any("default memory budget" in n for n in plan.notes)
