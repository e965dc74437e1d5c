"""Real gloo workers, launched once per session for the invariants and real-vs-simulated tests.

Starting 4 or 8 spawned workers (each importing torch) is most of those tests' time, so one
4-worker launch serves both test_invariants.py (n = 4) and test_real_vs_sim.py, and one
8-worker launch serves test_invariants.py (n = 8)."""
from __future__ import annotations

import pytest
import torch

from shardsched.train.launcher import launch
from tests.gossip._workers import REAL_CASES, REAL_LR, REAL_STEPS, gossip_worker


def _launch(tmp_path_factory, nproc: int, real: bool) -> dict:
    out = tmp_path_factory.mktemp(f"gossip{nproc}") / "res.pt"
    launch(gossip_worker, nproc=nproc, args=(str(out), REAL_CASES if real else None, REAL_STEPS, REAL_LR))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="session")
def four_workers(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, 4, real=True)


@pytest.fixture(scope="session")
def eight_workers(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, 8, real=False)
