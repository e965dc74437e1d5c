"""The blocked simulator (gossip/blocked.py) equals the step-by-step one on every algorithm it runs,
and `simulate` picks it exactly where it applies."""
from __future__ import annotations

import pytest
import torch

from shardsched.gossip import blocked
from shardsched.commands.gossip import DENSE_MAX_DIM, simulation_problem
from shardsched.gossip.config import GossipConfig, Sync, Topology
from shardsched.gossip.problems import DiagonalLeastSquares, LeastSquares
from shardsched.gossip.simulate import SimPath, choose_path, decaying_lr, simulate

CASES = {
    "sgp": (GossipConfig(sync=Sync.SGP), 1),
    "crossover_segments": (GossipConfig(sync=Sync.CROSSOVER, seed=3), 3),
    "crossover_groups": (GossipConfig(sync=Sync.CROSSOVER, groups=2, seed=3), 3),
    "dpsgd_ring": (GossipConfig(sync=Sync.DPSGD), 1),
    "dpsgd_exp": (GossipConfig(sync=Sync.DPSGD, topology=Topology.EXPONENTIAL), 2),
    "allreduce": (GossipConfig(sync=Sync.ALLREDUCE), 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_blocked_equals_stepwise(name, monkeypatch):
    # 16-column blocks: several blocks per segment, so the per-block sums of squares must add up
    monkeypatch.setattr(blocked, "BLOCK_BYTES", 3 * 8 * 8 * 16)
    cfg, segments = CASES[name]
    problem = DiagonalLeastSquares.make(workers=8, dim=300, pieces=6, seed=2, dtype=torch.float64)
    kw = dict(steps=30, lr=decaying_lr(0.3, half_life=10), segments=segments)
    ref = simulate(problem, cfg, path=SimPath.STEPWISE, **kw)
    got = simulate(problem, cfg, **kw)
    assert got.path is SimPath.BLOCKED and ref.path is SimPath.STEPWISE
    assert torch.allclose(got.z, ref.z, atol=1e-6, rtol=0)
    assert torch.allclose(got.weight, ref.weight, atol=1e-6, rtol=0)
    assert got.consensus == pytest.approx(ref.consensus, abs=1e-6)
    assert got.rel_error == pytest.approx(ref.rel_error, abs=1e-6)
    assert got.bytes_per_worker_per_step == ref.bytes_per_worker_per_step
    assert not torch.allclose(got.z, problem.initial().expand_as(got.z))  # it really moved


def test_path_is_chosen_by_problem_and_algorithm():
    diagonal = DiagonalLeastSquares.make(workers=4, dim=32)
    dense = LeastSquares.make(workers=4, dim=8, rows=8)
    assert choose_path(diagonal, GossipConfig(sync=Sync.CROSSOVER)) is SimPath.BLOCKED
    assert choose_path(dense, GossipConfig(sync=Sync.SGP)) is SimPath.STEPWISE
    assert choose_path(diagonal, GossipConfig(sync=Sync.OSGP)) is SimPath.STEPWISE  # a message in flight
    with pytest.raises(ValueError, match="separable"):
        choose_path(dense, GossipConfig(sync=Sync.SGP), SimPath.BLOCKED)


def test_cli_problem_takes_the_blocked_path_above_dense_size():
    cfg = GossipConfig(sync=Sync.SGP)
    big = simulation_problem(workers=4, params=DENSE_MAX_DIM + 1, tensors=16, seed=0)
    small = simulation_problem(workers=4, params=DENSE_MAX_DIM, tensors=16, seed=0)
    assert choose_path(big, cfg) is SimPath.BLOCKED and choose_path(small, cfg) is SimPath.STEPWISE
