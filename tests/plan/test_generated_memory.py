"""The memory model against FSDP2 on generated models and plans (issue 15).

Hypothesis draws seeds; each seed is one random model (causal LMs with vocabularies
256..64k, tied or untied heads, the loss in the root or in a child, `nn.Sequential` or custom
MLPs, blocks applied repeatedly, wrappers; BatchNorm/GroupNorm CNNs; MLP-Mixers) and one
random plan (every strategy, checkpointing whole-layer or selective, mixed strategies, fused units, auto at budgets
from the least-memory plan's peak to twice it), run under FSDP2 on a fake process group and
measured by FSDPMemTracker (tests/plan/_generated.py). A fixed sample of 50 runs here; the
benchmark `bench/bench_generated_memory.py --cases 500` prints the distribution.

What is asserted is the issue's goal (`--cases 500 --seed 10000`, session 9, a quarter of the
plans accumulating 2-3 micro-batches, half the CNNs U-Nets: all within 3%, 97.4% within 1%,
-2.7..+2.8%, 0 of 212 auto plans over their budget):
- every plan runs, and auto plans never exceed their budget;
- no prediction is more than 3% below the measured peak (the dangerous side: a plan that
  says it fits and does not) or above it.
Below, the cases that found a moment, each within 1% of FSDPMemTracker (and its budget).
"""
import warnings

import pytest
from hypothesis import HealthCheck, given, seed, settings

from ._generated import cases, draw_case, measure

UNDER = 0.03   # the 3%; 500 cases (seeds 10000..10499): -2.7% at worst (a CNN accumulating 2)
OVER = 0.03    # +2.8% at worst (an LM with a repeated block, auto)
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
        assert c["measured"] <= c["budget"], (spec, plan, c["measured"], c["budget"])  # 0 of 212 auto plans over


def test_generated_models_and_plans_against_fsdp2():
    _seen.clear()
    _each()
    inside = sum(abs(c["error"]) <= 0.01 for c in _seen) / len(_seen)
    print(f"{len(_seen)} cases, all within 3%, {inside:.0%} within 1%")
    assert len(_seen) >= SAMPLE * 0.9  # hypothesis may drop a few duplicate seeds
    assert inside >= 0.9  # 97.4% of the 500


def _case(k: int) -> dict:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        return measure(*draw_case(k))


@pytest.mark.parametrize("k", [10150, 10154, 10387])
def test_repeated_blocks_the_generator_found(k):
    """Blocks applied 2-3 times, under shard_grad_op (auto, checkpointed), full_shard next to
    replicate units, and DDP: FSDP2 gathers a repeated module again for each earlier call's
    backward, next to the gradient its later calls accumulated ([Note: a repeated module's
    later calls] in plan/units.py). Before: -4.2% (over its budget), +7.8%, +6.1%."""
    c = _case(k)
    assert abs(c["error"]) <= 0.01, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [10003, 10054, 10058, 10217])
def test_accumulating_plans_the_generator_found(k):
    """Accumulation until the last micro-batch ([Note: accumulation memory] in sim/memory.py):
    DDP under no_sync keeps `.grad` beside its bucket (-6.7%); gradients added in place, not
    beside (+4.3%); a fused unit's last micro-batch reduces the whole unit at its first module
    (-7.2%, over its budget) and its last layer adds into what it reduces (+12.2%)."""
    c = _case(k)
    # within the issue's 3% (auto's plan follows the solver: 10058's is 2% over), under by 1% at most
    assert -0.01 <= c["error"] <= 0.03, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [10080, 10240])
def test_auto_after_a_recomputed_unit_fits(k):
    """Auto plans of CNNs with a selective or checkpointed unit before a plain one: the plain
    unit's saved input was the recomputed unit's output, counted by neither ([Note: the output
    a recomputed unit hands over] in sim/scenario.py): 0.2% and 0.33% over their budgets."""
    c = _case(k)
    assert c["measured"] <= c["budget"], (c["measured"], c["budget"])
    assert abs(c["error"]) <= 0.02, c["error"]


@pytest.mark.parametrize("k", [10406, 10185, 673838])
def test_unets_the_generator_found(k):
    """U-Nets (the loop's `x` holds the last output through the next decoder's forward, [Note:
    outputs the caller's code holds] in profile/held.py): a selective plan (-3.3%), an auto plan
    of one fused checkpointed unit (-10.5%, over its budget), and an auto plan of one fused
    plain unit whose head's input, a ReLU's output, was counted twice at its last module's
    start (+3.6%)."""
    c = _case(k)
    assert abs(c["error"]) <= 0.01, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [49, 32, 21])
def test_cnns_the_generator_found_over_predicted(k):
    """GroupNorm/BatchNorm CNNs (`bench_generated_memory.py --cases 60`): a fused unit's module
    reduces after FSDP2 resharded the unit (`Inner.resharded`: auto, +8.2%); a replicate unit's
    prefetch holds nothing ([Note: a shard group of one issues no AllGather] in sim/timeline.py:
    replicate next to full_shard, +3.8%); accumulating with a reduce every micro-batch, the
    layers a fused unit reduced so far add into gradients already held
    (`Scenario.accumulates_sharded`: +1.8%). Each now within 8 bytes."""
    c = _case(k)
    assert abs(c["error"]) <= 0.001, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [353, 174122, 87061, 159])
def test_the_generators_under_predictions_of_session_22(k):
    """Accumulating with a reduce every micro-batch, a unit that all-reduces (replicate) keeps its
    reduce output beside the held gradients until the end of backward (`_Live.all_reduce_held`:
    a CNN alternating full_shard and replicate, -4.3%; fused Mixers under replicate, -6.8% and
    -4.4%); a block called twice gathers again at its later call beside the earlier AllGather
    output ([Note: a repeated layer's later forward calls] in plan/units.py: -13.6%, its auto
    plan over its budget)."""
    c = _case(k)
    assert -0.01 <= c["error"] <= 0.01, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [257, 175, 210])
def test_a_block_called_again_inside_a_fused_unit(k):
    """A block applied 2-3 times inside a fused unit (`bench_generated_memory.py --cases 300
    --seed 60`: auto at world 64, +6.4% and +3.4%; full_shard+ckpt accumulating, +3.2%): in its
    earlier call's backward the layers after it have reduced (their sharded gradients, not the
    unsharded ones: an inner moment of the unit, `UnitCost.inner_moments`), and recomputing it
    keeps the inputs of the calls before it only (`_recall_own`). Each now within 0.1%."""
    c = _case(k)
    assert abs(c["error"]) <= 0.001, c["error"]
    if c["budget"] is not None:
        assert c["measured"] <= c["budget"], (c["measured"], c["budget"])


@pytest.mark.parametrize("k", [244, 126])
def test_accumulating_twice_without_a_reduce_in_between(k):
    """Accumulating 2 under `last` (`--cases 300 --seed 60`): a fused Mixer under replicate held
    its whole ReduceScatter input to the end of its backward, where the next module's reduce
    frees it (`sim.memory.in_place_held`: +7.9%); a Mixer under full_shard+ckpt held every
    unit's unsharded gradients, which no micro-batch of two holds (the first has those of the
    units behind it, the last those not yet reduced: [Note: accumulation memory], +3.3%). Each
    now within 0.1%."""
    c = _case(k)
    assert abs(c["error"]) <= 0.001, c["error"]
