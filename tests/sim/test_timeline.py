"""The discrete-event replay against hand-computed timelines."""
import pytest

from shardsched.cost.device import DeviceSpec, Cluster, Link
from shardsched.cost.memory import state_bytes
from shardsched.core.types import Optimizer, Precision, Strategy
from shardsched.sim.scenario import Scenario, UnitCost
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
