"""The memory model against FSDP2 on generated models and plans (issue 15).

Hypothesis draws seeds; each seed is one random model (causal LMs with vocabularies
256..64k, tied or untied heads, the loss in the root or in a child, `nn.Sequential` or custom
MLPs, blocks applied repeatedly, wrappers; BatchNorm/GroupNorm CNNs; MLP-Mixers) and one
random plan (every strategy, checkpointing whole-layer or selective, mixed strategies, fused units, auto at budgets
from the least-memory plan's peak to twice it), run under FSDP2 on a fake process group and
measured by FSDPMemTracker (tests/plan/_generated.py). A fixed sample of 50 runs here; the
benchmark `bench/bench_generated_memory.py --cases 500` prints the distribution.

What is asserted is what holds today (`--cases 500 --seed 10000`, session 7: 99% within 3%,
97% within 1%, -2.0..+7.8%, 6 of 212 auto plans over their budget by 0.2-1.0%), and it is not
yet the issue's goal of 3% on every case and no auto plan over its budget:
- every plan runs, and auto plans never exceed their budget by more than BUDGET_SLACK;
- no prediction is more than UNDER below the measured peak (the dangerous side: a plan that
  says it fits and does not), none more than OVER above it, and at least INSIDE_3 of the
  sample is within 3%.
"""
import warnings

import pytest
from hypothesis import HealthCheck, given, seed, settings

from ._generated import cases, draw_case, measure

UNDER = 0.025  # 500 cases (seeds 10000..10499): -2.0% at worst
OVER = 0.08    # +7.8% at worst
INSIDE_3 = 0.95  # 99% there
BUDGET_SLACK = 0.01  # 6 of 212 auto plans over their budget, by 1.0% at most
SAMPLE = 50
_seen: list[dict] = []


@seed(15)
@settings(max_examples=SAMPLE, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(cases())
def _each(case):
    spec, plan = case
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        c = measure(spec, plan)
    print(f"{spec.family:5s} {plan.strategy + ('/' + plan.other if plan.other else ''):34s} w={plan.world:3d} "
          f"measured={c['measured'] / 2**20:8.3f} MiB predicted={c['predicted'] / 2**20:8.3f} MiB "
          f"error={c['error']:+.1%}")
    _seen.append(c)
    assert -UNDER <= c["error"] <= OVER, (spec, plan, c["error"])
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"] * (1 + BUDGET_SLACK), (spec, plan, c["measured"], c["budget"])


def test_generated_models_and_plans_against_fsdp2():
    _seen.clear()
    _each()
    inside = sum(abs(c["error"]) <= 0.03 for c in _seen) / len(_seen)
    print(f"{len(_seen)} cases, {inside:.0%} within 3%")
    assert len(_seen) >= SAMPLE * 0.9  # hypothesis may drop a few duplicate seeds
    assert inside >= INSIDE_3


@pytest.mark.parametrize("k", [10150, 10154, 10387])
def test_repeated_blocks_the_generator_found(k):
    """Blocks applied 2-3 times, under shard_grad_op (auto, checkpointed), full_shard next to
    replicate units, and DDP: FSDP2 gathers a repeated module again for each earlier call's
    backward, next to the gradient its later calls accumulated ([Note: a repeated module's
    later calls] in plan/units.py). Before: -4.2% (over its budget), +7.8%, +6.1%."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        c = measure(*draw_case(k))
    assert abs(c["error"]) <= 0.01, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])
