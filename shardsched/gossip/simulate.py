"""N virtual workers in one process, mixing through the in-process communicator.

The simulator runs exactly the step real workers run (mixing.py's docstring):
gradients of every worker's local least-squares objective, the mixer's gradient
reduction, an SGD step, the mixer's gossip. Only the communicator differs
(InProcessCommunicator instead of ProcessGroupCommunicator), so a run with the
same seed matches real workers to rounding (tests/gossip/test_real_vs_sim.py).
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from shardsched.gossip.blocked import BLOCKED_SYNCS, probe_steps, run_blocked
from shardsched.gossip.comm import InProcessCommunicator
from shardsched.gossip.config import GossipConfig, Sync
from shardsched.gossip.mixing import make_mixer
from shardsched.gossip.segments import equal_bounds


def decaying_lr(lr: float, *, half_life: float = 0.0) -> Callable[[int], float]:
    """lr / (1 + step / half_life) (constant when half_life is 0): the decaying
    step size under which gossip reaches the exact optimum."""
    if half_life <= 0:
        return lambda step: lr
    return lambda step: lr / (1.0 + step / half_life)


@dataclass(frozen=True, kw_only=True)
class SimResult:
    sync: Sync
    z: torch.Tensor
    """(n, P) final de-biased models."""
    weight: torch.Tensor
    """(n,) final push-sum weights (ones for the other algorithms)."""
    consensus: tuple[float, ...]
    """mean_i ||z_i - mean z|| after every step."""
    rel_error: tuple[float, ...]
    """max_i ||z_i - x*|| / ||x*|| after every step (x* the global optimum)."""
    bytes_per_worker_per_step: float
    """Bytes one worker sends per step, averaged over workers and steps."""
    seconds: float
    """Wall-clock seconds of the simulation."""
    path: "SimPath"
    """Which simulator ran (STEPWISE or BLOCKED)."""


def consensus_distance(z: torch.Tensor) -> float:
    return float((z - z.mean(dim=0, keepdim=True)).norm(dim=1).mean())


class SimPath(str, enum.Enum):
    """How the simulator runs (docs/design.md, "Gossip": which path runs when)."""

    AUTO = "auto"
    """BLOCKED where it applies (separable problem, memoryless mixing, numba installed), else STEPWISE."""
    STEPWISE = "stepwise"
    """One step at a time over the whole (n, P) state through the in-process communicator."""
    BLOCKED = "blocked"
    """Every step on one cache-sized block of coordinates at a time (gossip/blocked.py)."""


def _numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def choose_path(problem, cfg: GossipConfig, path: SimPath = SimPath.AUTO) -> SimPath:
    """The path `simulate` takes: STEPWISE unless the blocked one applies (and was not refused)."""
    fits = getattr(problem, "separable", False) and cfg.sync in BLOCKED_SYNCS
    if path is SimPath.BLOCKED and not fits:
        raise ValueError(f"the blocked simulator needs a separable problem and one of "
                         f"{sorted(s.value for s in BLOCKED_SYNCS)}, not {type(problem).__name__} / {cfg.sync.value}")
    if path is SimPath.AUTO:
        return SimPath.BLOCKED if fits and _numba_available() else SimPath.STEPWISE
    return path


def prepare(problem, cfg: GossipConfig, *, steps: int, segments: int = 1) -> None:
    """Do ahead, into blocked.py's cache, what `simulate` would do first without reading the problem's
    data (the blocked path's probe): `problem` may be one of `DiagonalLeastSquares.empty`'s shapes."""
    if choose_path(problem, cfg) is SimPath.BLOCKED:
        bounds = equal_bounds(problem.dim, problem.pieces, segments)
        probe_steps(cfg, n=problem.workers, dim=problem.dim, bounds=bounds, steps=steps, dtype=problem.c.dtype)


def simulate(problem, cfg: GossipConfig, *, steps: int, lr: Callable[[int], float], segments: int = 1,
             track_error: bool = True, path: SimPath = SimPath.AUTO, models: bool = True) -> SimResult:
    """Run `steps` steps of `cfg.sync` on `problem` (LeastSquares or DiagonalLeastSquares).
    `models=False`: SimResult.z is (n, 0), so the blocked path never writes the (n, P) models."""
    bounds = equal_bounds(problem.dim, problem.pieces, segments)
    t0 = time.perf_counter()
    if choose_path(problem, cfg, path) is SimPath.BLOCKED:
        return _simulate_blocked(problem, cfg, steps=steps, lr=lr, bounds=bounds, track_error=track_error,
                                 models=models, t0=t0)
    n = problem.workers
    comm = InProcessCommunicator(n)
    mixer = make_mixer(comm, cfg, bounds)
    z = problem.initial().expand(n, -1).clone()
    best = problem.optimum() if track_error else None
    consensus, errors = [], []
    for step in range(steps):
        g = mixer.reduce_grads(problem.grad(z))
        z = mixer.mix(z.sub_(g, alpha=lr(step)), step)
        consensus.append(consensus_distance(z))
        if best is not None:
            errors.append(float(((z - best).norm(dim=1) / best.norm()).max()))
    z = mixer.flush(z)
    return SimResult(sync=cfg.sync, z=z if models else z[:, :0], weight=mixer.weight.clone(), consensus=tuple(consensus),
                     rel_error=tuple(errors), bytes_per_worker_per_step=float(comm.bytes_sent.mean()) / max(1, steps),
                     seconds=time.perf_counter() - t0, path=SimPath.STEPWISE)


def _simulate_blocked(problem, cfg: GossipConfig, *, steps: int, lr: Callable[[int], float],
                      bounds, track_error: bool, models: bool, t0: float) -> SimResult:
    best = problem.optimum() if track_error else None
    run = run_blocked(problem, cfg, steps=steps, lrs=[lr(k) for k in range(steps)], bounds=bounds, best=best,
                      models=models)
    consensus = tuple(float(v) for v in np.sqrt(run.cons_sq).mean(axis=1))
    errors = () if best is None else tuple(float(v) for v in np.sqrt(run.err_sq).max(axis=1) / float(best.norm()))
    return SimResult(sync=cfg.sync, z=run.z, weight=run.steps.weight, consensus=consensus, rel_error=errors,
                     bytes_per_worker_per_step=run.steps.bytes_per_worker_per_step,
                     seconds=time.perf_counter() - t0, path=SimPath.BLOCKED)


def geometric_rate(values: tuple[float, ...]) -> float:
    """Per-step contraction fitted between the first and last positive value."""
    pos = [v for v in values if v > 0]
    if len(pos) < 2:
        return 0.0
    return math.exp((math.log(pos[-1]) - math.log(pos[0])) / (len(pos) - 1))
