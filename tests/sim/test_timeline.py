"""The discrete-event replay against hand-computed timelines."""
import dataclasses

import pytest

from shardsched.cost.comm import Collective
from shardsched.cost.device import DeviceSpec, Cluster, Link
from shardsched.cost.memory import state_bytes
from shardsched.core.types import Optimizer, Precision, Strategy
from shardsched.sim.scenario import Scenario
from shardsched.sim.unit_cost import UnitCost
from shardsched.sim.simulate import simulate
from shardsched.sim.timeline import replay

FS, SGO, REP = Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP, Strategy.REPLICATE


def scenario(strategies, fwd, bwd, *, world=2):
    # world 2, no latency, bandwidth such that every AllGather / ReduceScatter of a
    # 1000-parameter fp32 unit takes (1/2) * 4000 B / 4000 B/s = 0.5 s.
    dev = DeviceSpec(name="t", peak_flops=1.0, mfu=1.0, memory_bytes=1 << 40,
                     intra=Link(alpha_seconds=0.0, bandwidth=4000.0), inter=Link(alpha_seconds=0.0, bandwidth=4000.0))
    units = tuple(UnitCost(name=f"u{i}", layers=(f"u{i}",), params=1000, forward_seconds=1.0,
                           backward_seconds=2.0, activation_bytes=100) for i in range(len(strategies)))
    return Scenario(units=units, strategies=tuple(strategies), forward_launch=tuple(fwd), backward_launch=tuple(bwd),
                    cluster=Cluster(world=world, gpus_per_node=world, device=dev),
                    state=state_bytes(Precision.FP32, Optimizer.ADAM))


def test_full_shard_without_prefetch_exposes_every_gather():
    tl = replay(scenario([FS, FS], [0, 1], [3, 2]))
    # AG0 [0,.5] F0 [.5,1.5] AG1 [1.5,2] F1 [2,3] AG1' [3,3.5] B1 [3.5,5.5] RS1 [5.5,6]
    # AG0' issued at 5.5, channel busy until 6: [6,6.5] B0 [6.5,8.5] RS0 [8.5,9] opt at 9.
    assert [(c.start, c.end) for c in tl.compute] == [(0.5, 1.5), (2.0, 3.0), (3.5, 5.5), (6.5, 8.5), (9.0, 9.0)]
    assert tl.step_seconds == 9.0


def test_prefetch_hides_gathers_behind_compute():
    tl = replay(scenario([FS, FS], [0, 0], [2, 2]))
    # AG0 [0,.5], AG1 [.5,1] (prefetched at step 0), F0 [.5,1.5], F1 [1.5,2.5];
    # step 2: AG1' [2.5,3], AG0' [3,3.5]; B1 [3,5]; RS1 [5,5.5]; B0 [5,7]; RS0 [7,7.5].
    assert [(c.start, c.end) for c in tl.compute][:4] == [(0.5, 1.5), (1.5, 2.5), (3.0, 5.0), (5.0, 7.0)]
    assert tl.step_seconds == 7.5


def test_replicate_gathers_nothing_and_all_reduces():
    tl = replay(scenario([REP], [0], [None]))
    # F [0,1] B [1,3] AllReduce = 2 x 0.5 [3,4]
    assert tl.step_seconds == 4.0


def test_predictions_are_consistent():
    res = simulate(scenario([FS, SGO, REP], [0, 0, 1], [4, None, None]))
    p = res.predicted
    assert p.step_seconds >= p.lower_bound_seconds >= p.compute_seconds
    assert p.exposed_comm_seconds == pytest.approx(p.step_seconds - p.compute_seconds)
    assert p.peak_bytes == max(m.total for m in res.memory)


def test_launch_outside_window_is_rejected():
    with pytest.raises(ValueError, match="backward launch"):
        simulate(scenario([FS, FS], [0, 1], [3, 1]))


def test_memory_of_full_shard_forward_step_by_hand():
    from shardsched.sim.memory import step_memory
    sc = scenario([FS, FS], [0, 1], [3, 2])  # world 2: each unit's shard is 500 params
    persistent = 2 * 500 * (4 + 8) + 8       # fp32 params + Adam m, v (grads are freed by zero_grad), the loss
    # and its seed gradient (two fp32 scalars)
    mem = step_memory(sc)
    # F1 copy-out: u1 unsharded (4000) + its gather buffer (4000) + u0's held buffer (4000) + u0's activations
    # F1 compute:  u1 unsharded + its held buffer + both activations; u0 was freed after its forward
    assert mem[1].total == persistent + 3 * 4000 + 100
    # B0 copy-out: u1's reduced gradient shard (500*4), u0 unsharded + its gather buffer (4000 each),
    # u1's retained ReduceScatter input (4000), u0's activations (100). It beats B0's end
    # (u0's gradients 4000 instead of its gather buffer, activations freed: 100 less).
    assert mem[3].total == persistent + 2000 + 4000 + 4000 + 4000 + 100
    assert mem[3].breakdown.comm_buffers == 8000


def shared(sc, share):
    """`sc` on its device with collectives holding `share` of the compute beside them."""
    import dataclasses
    dev = dataclasses.replace(sc.cluster.device, comm_sm_share=share)
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, device=dev))


def test_compute_beside_a_collective_is_slowed_by_hand():
    """[Note: collectives slow the compute beside them], share 1/4, `test_prefetch_hides_gathers_behind_compute`'s
    schedule: F0 runs 0.5 s beside AG1, B1 0.5 s beside AG0', B0 0.5 s beside RS1; each is 0.125 s
    longer and moves what follows."""
    tl = replay(shared(scenario([FS, FS], [0, 0], [2, 2]), 0.25))
    assert [(c.start, c.end) for c in tl.compute] == [(0.5, 1.625), (1.625, 2.625), (3.125, 5.25), (5.25, 7.375),
                                                      (7.875, 7.875)]
    assert [(c.start, c.end) for c in tl.comm] == [(0.0, 0.5), (0.5, 1.0), (2.625, 3.125), (3.125, 3.625),
                                                   (5.25, 5.75), (7.375, 7.875)]
    assert tl.step_seconds == 7.5 + 0.25 * 1.5  # 1.5 s overlapped in the unslowed step


def _overlap(tl) -> float:
    """Brute force: seconds compute and the channel both run, from the events."""
    return sum(max(0.0, min(a.end, c.end) - max(a.start, c.start)) for a in tl.compute for c in tl.comm)


def test_slowdown_is_the_share_of_the_overlapped_seconds():
    """On random schedules of random units: step = unslowed step + share x (its overlap, counted
    from the events by brute force) = (1 - share) unslowed + share (compute + communication): no
    moment leaves both streams idle. Events keep their order: no compute before its AllGather."""
    import random
    r = random.Random(0)
    for _ in range(60):
        n = r.randint(1, 5)
        strategies = [r.choice([FS, SGO, REP]) for _ in range(n)]
        fwd = [r.randint(0, i) for i in range(n)]
        bwd = [r.randint(n, 2 * n - 1 - i) if s is FS else None for i, s in enumerate(strategies)]
        sc = scenario(strategies, fwd, bwd)
        units = tuple(dataclasses.replace(u, forward_seconds=r.uniform(0.1, 2), backward_seconds=r.uniform(0.1, 3))
                      for u in sc.units)
        sc = dataclasses.replace(sc, units=units)
        plain, slow = replay(sc), replay(shared(sc, 0.3))
        assert slow.step_seconds == pytest.approx(plain.step_seconds + 0.3 * _overlap(plain), rel=1e-12)
        assert _overlap(plain) == pytest.approx(plain.compute_seconds + plain.comm_seconds - plain.step_seconds,
                                                rel=1e-9, abs=1e-12)
        assert slow.comm_seconds == pytest.approx(plain.comm_seconds, rel=1e-12)
        gathers = [c for c in slow.comm if c.kind is Collective.ALL_GATHER]
        for i in range(n):  # compute after its own AllGathers (forward, then backward)
            mine = [c for c in gathers if c.unit == i]
            for c, use in zip(mine, (i, 2 * n - 1 - i)):
                assert slow.compute[use].start >= c.end - 1e-12
        for a, b in zip(slow.comm, slow.comm[1:]):  # one channel, first in first out
            assert b.start >= a.end - 1e-12


def test_exact_slowdown_hides_what_a_longer_collective_covers():
    """`replay(exact=True)`: compute at 3/4 speed while the channel runs (share 1/4). F0 (0.25 s)
    runs inside AG1 and takes 1/3 s, but F1 waits for AG1 until 1.0 anyway; B1 and B0 each run
    0.5 s beside a collective: 2 + 0.125 s. The first order charges F0's 0.0625 s as well."""
    sc = scenario([FS, FS], [0, 0], [2, 2])
    sc = shared(dataclasses.replace(sc, units=(dataclasses.replace(sc.units[0], forward_seconds=0.25), sc.units[1])),
                0.25)
    exact = replay(sc, exact=True)
    assert [t for c in exact.compute for t in (c.start, c.end)] == pytest.approx(
        [0.5, 0.5 + 0.25 / 0.75, 1.0, 2.0, 2.5, 4.625, 4.625, 6.75, 7.25, 7.25])
    assert exact.step_seconds == 7.25
    assert replay(sc).step_seconds == 7.0 + 0.25 * (0.25 + 0.5 + 0.5)  # unslowed 7 s, 1.25 s overlapped
