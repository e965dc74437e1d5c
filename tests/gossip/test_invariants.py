"""Invariants of every mixing rule on 4 and 8 real gloo workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shardsched.gossip.config import Topology
from shardsched.gossip.topology import dpsgd_matrix


@pytest.fixture(params=[4, 8])
def mixed(request):
    """(n, results) of the session's 4- and 8-worker launches (conftest.py)."""
    n = request.param
    return n, request.getfixturevalue("four_workers" if n == 4 else "eight_workers")["invariants"]


def test_push_sum_conserves_weight_and_mass(mixed):
    n, res = mixed
    total = res["z0"].sum(dim=0)
    for z, w in res["sgp"]["steps"]:
        assert torch.allclose(w.sum(), torch.tensor(float(n), dtype=torch.float64), atol=1e-12)
        assert torch.allclose((z * w[:, None]).sum(dim=0), total, atol=1e-12)
    # OSGP: during the run half the mass is in flight (sum w < n); after absorbing it, all is back.
    assert all(w.sum() < n - 0.1 for _, w in res["osgp"]["steps"])
    w = res["osgp"]["weight"]
    assert torch.allclose(w.sum(), torch.tensor(float(n), dtype=torch.float64), atol=1e-12)
    assert torch.allclose((res["osgp"]["final"] * w[:, None]).sum(dim=0), total, atol=1e-12)


def test_exponential_graph_reaches_exact_mean_in_log2_n_steps(mixed):
    n, res = mixed
    rounds = int(np.log2(n))
    z, _ = res["sgp"]["steps"][rounds - 1]
    assert torch.allclose(z, res["z0"].mean(dim=0).expand_as(z), atol=1e-14, rtol=0)
    if rounds > 1:
        z_early, _ = res["sgp"]["steps"][rounds - 2]
        assert not torch.allclose(z_early, res["z0"].mean(dim=0).expand_as(z_early), atol=1e-6)


@pytest.mark.parametrize("name", ["dpsgd_ring", "dpsgd_exp", "crossover", "crossover_g2"])
def test_model_average_preserved_exactly(mixed, name):
    _, res = mixed
    steps = res[name]["steps"]
    # With groups, the first broadcast makes the members of a group equal (in training they start
    # equal); from then on the average is preserved.
    mean = steps[0][0].mean(dim=0) if name == "crossover_g2" else res["z0"].mean(dim=0)
    for z, _ in steps:
        assert torch.allclose(z.mean(dim=0), mean, atol=1e-14, rtol=0)


def test_crossover_groups_agree_and_roots_move(mixed):
    n, res = mixed
    z, _ = res["crossover_g2"]["steps"][0]
    half = n // 2
    assert torch.equal(z[:half], z[0].expand(half, -1)) and torch.equal(z[half:], z[half].expand(half, -1))


def test_crossover_permutations_are_identical_derangements(mixed):
    n, res = mixed
    perms = res["perms"]
    assert all(p == perms[0] for p in perms)
    for perm in perms[0]:
        assert sorted(perm) == list(range(n)) and all(p != i for i, p in enumerate(perm))
    assert len(set(perms[0])) > 3  # really random, not one fixed permutation


def test_consensus_shrinks_geometrically_on_static_ring(mixed):
    n, res = mixed
    w = dpsgd_matrix(n, Topology.RING)
    lam = sorted(np.abs(np.linalg.eigvalsh(w)))[-2]
    dist0 = (res["z0"] - res["z0"].mean(dim=0)).norm()
    for k, (z, _) in enumerate(res["dpsgd_ring"]["steps"], start=1):
        assert (z - z.mean(dim=0)).norm() <= lam ** k * dist0 * (1 + 1e-9)
    assert (res["dpsgd_ring"]["final"] - res["z0"].mean(dim=0)).norm() < 0.2 * dist0
