"""Real workers (gloo, GossipDataParallel) and the simulator agree after 20 steps, every algorithm;
and the simulator's least squares converges to the closed-form optimum."""
from __future__ import annotations

import pytest
import torch

from shardsched.gossip.config import GossipConfig, Sync, Topology
from shardsched.gossip.problems import LeastSquares
from shardsched.gossip.simulate import decaying_lr, simulate
from tests.gossip._workers import REAL_CASES, REAL_LR, REAL_STEPS

CASES, STEPS, LR = REAL_CASES, REAL_STEPS, REAL_LR


@pytest.fixture(scope="module")
def real(four_workers):
    """The 4 real workers' final replicas and bytes, per case (one launch, shared: conftest.py)."""
    return four_workers["real"]


@pytest.mark.parametrize("name", list(CASES))
def test_real_equals_simulated(real, name):
    cfg, segments = CASES[name]
    problem = LeastSquares.make(workers=4, dim=12, rows=16, pieces=4, seed=7)
    sim = simulate(problem, cfg, steps=STEPS, lr=decaying_lr(LR), segments=segments)
    params, real_bytes = real[name]
    assert torch.allclose(params, sim.z, atol=1e-6, rtol=0)
    # rank 0's bytes: the same communication was counted on both paths
    assert real_bytes == pytest.approx(sim.bytes_per_worker_per_step * STEPS, rel=0.5)


@pytest.mark.parametrize("sync,topology,groups", [
    (Sync.SGP, Topology.RING, 0), (Sync.OSGP, Topology.RING, 0), (Sync.DPSGD, Topology.EXPONENTIAL, 0),
    (Sync.DPSGD, Topology.RING, 0), (Sync.CROSSOVER, Topology.RING, 0), (Sync.CROSSOVER, Topology.RING, 2)])
def test_gossip_converges_with_decaying_step(sync, topology, groups):
    problem = LeastSquares.make(workers=8, dim=8, rows=16, pieces=4, seed=1, spread=0.5)
    res = simulate(problem, GossipConfig(sync=sync, topology=topology, groups=groups),
                   steps=1000, lr=decaying_lr(0.5, half_life=100), segments=4)
    assert res.rel_error[-1] < 1e-2
    assert res.rel_error[99] > 2 * res.rel_error[-1]  # it got there by converging, not by luck at the start


def test_allreduce_reaches_optimum_exactly():
    problem = LeastSquares.make(workers=8, dim=8, rows=16, pieces=4, seed=1, spread=0.5)
    res = simulate(problem, GossipConfig(sync=Sync.ALLREDUCE), steps=600, lr=decaying_lr(1.0))
    assert res.rel_error[-1] < 1e-8
    assert max(res.consensus) < 1e-12
