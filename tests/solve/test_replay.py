"""The search's table-driven step seconds (`solve.replay.Replay`) against the simulator's
replay: the same float on random schedules (strategies, launch points, checkpointing), with
communication beside compute and blocking it, across nodes, and on a plan that runs on DDP."""
from __future__ import annotations

import dataclasses
import random

import pytest

from shardsched.core.types import Checkpoint, Optimizer, Precision, Strategy
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.gpt_config import GPTConfig
from shardsched.profile.analytic import analytic_profile
from shardsched.sim.timeline import replay
from shardsched.solve.candidates import Choice, candidate_problems
from shardsched.solve.replay import Replay

from tests.solve.test_milp_vs_brute import CLUSTER, KW, OVERLAP, random_choice, synth

# FSDP2's host work per unit and per tensor (calibrated devices have it; the presets do not)
A100 = Cluster(world=64, gpus_per_node=8, device=dataclasses.replace(DEVICES["a100"], unit_overhead_seconds=2e-4,
                                                                    tensor_overhead_seconds=1e-5))


def problems(cluster: Cluster, **kw):
    if cluster is A100:  # FSDP2's host work in the units' seconds, node-aware strategies
        prof = analytic_profile(GPTConfig(vocab=32000, layers=6, hidden=1024, heads=16, seq=1024), micro_batch=1,
                                seq=1024, device=cluster.device)
        return candidate_problems(prof, cluster, **{**KW, **kw})
    return [p for seed in (0, 1) for p in candidate_problems(synth(5, seed, ckpt_saves=True), cluster, **{**KW, **kw})]


@pytest.mark.parametrize("cluster", [OVERLAP, CLUSTER, A100], ids=["overlap", "blocking", "a100-nodes"])
def test_replay_tables_equal_the_simulator(cluster):
    r, checked = random.Random(0), 0
    for p in problems(cluster):
        fast = Replay(p)
        for _ in range(40):
            ch = random_choice(p, r)
            assert fast.seconds(ch) == replay(p.scenario(ch)).step_seconds
            checked += 1
    assert checked >= 80


def test_a_plan_on_ddp_is_priced_as_ddp():
    """All-replicate fp32 runs on DDP, without FSDP2's host work (`Scenario.on_ddp`)."""
    p = problems(A100, precision=Precision.FP32, optimizer=Optimizer.ADAM)[0]
    ch = Choice((Strategy.REPLICATE,) * p.n, tuple(range(p.n)), (None,) * p.n, ())
    sc = p.scenario(ch)
    assert sc.on_ddp
    assert Replay(p).seconds(ch) == replay(sc).step_seconds


def test_a_selective_unit_recomputes_its_selective_share():
    """A selective unit's backward recomputes `UnitCost.recompute` of its selective form, not its
    forward (`Scenario.backward_seconds`): choices that mix none, full and selective."""
    from tests.solve.test_selective_vs_brute import mixed_choice, synth_sac
    r, modes = random.Random(1), set()
    for cluster in (OVERLAP, A100):
        for p in candidate_problems(synth_sac(4, 1), cluster, **KW):
            p = p._replace(checkpointable=True)
            fast = Replay(p)
            for _ in range(20):
                ch = mixed_choice(p, r)
                modes.update(ch.ckpt)
                assert fast.seconds(ch) == replay(p.scenario(ch)).step_seconds
    assert Checkpoint.SELECTIVE in modes


@pytest.mark.parametrize("cluster", [OVERLAP, A100], ids=["overlap", "a100-nodes"])
def test_a_replicate_units_launch_changes_neither_time_nor_memory(cluster):
    """[Note: a shard group of one issues no AllGather] in sim/timeline.py: moving a replicate
    unit's forward launch anywhere in its window leaves the step and every moment as they were
    (its unit never waits for the channel, and a launch before its use holds nothing), in the
    simulator, the search's tables and greedy's evaluator."""
    from shardsched.sim.memory import step_memory
    from shardsched.solve.greedy import Evaluator
    r, moved = random.Random(3), 0
    for p in problems(cluster):
        fast, ev = Replay(p), Evaluator(p)
        for _ in range(20):
            ch = random_choice(p, r)
            reps = [i for i, k in enumerate(ch.strategies) if k is Strategy.REPLICATE and i > 0]
            if Strategy.REPLICATE not in p.allowed[-1] or not reps:
                ch = ch._replace(strategies=ch.strategies[:-1] + (Strategy.REPLICATE,)) \
                    if Strategy.REPLICATE in p.allowed[-1] else ch
                reps = [i for i, k in enumerate(ch.strategies) if k is Strategy.REPLICATE and i > 0]
            for i in reps:
                early = ch._replace(fwd=ch.fwd[:i] + (r.randrange(0, i),) + ch.fwd[i + 1:])
                seconds = replay(p.scenario(ch)).step_seconds
                assert replay(p.scenario(early)).step_seconds == pytest.approx(seconds, rel=1e-12)
                assert fast.seconds(early) == fast.seconds(ch) == replay(p.scenario(ch)).step_seconds
                assert [m.total for m in step_memory(p.scenario(early))] == \
                    [m.total for m in step_memory(p.scenario(ch))]
                assert ev.peak(early) == ev.peak(ch)
                moved += 1
    assert moved >= 20
