"""The temporally blocked simulator: every step on one block of coordinates at a time.

[Note: why blocking is exact] On a separable problem (DiagonalLeastSquares: the
gradient of coordinate j depends on coordinate j only) a step is, per coordinate
column z[:, j] of the (n, P) state, `z <- M_t,s (z - lr_t R g(z))`: R (the
gradient reduction) and M_t,s (the mixing of segment s at step t) are n x n
matrices that do not depend on z. They depend on the push-sum weights, which
evolve from the weights alone, and on the peers/permutations, which depend on
the step. So all steps can run on a block of columns before the next block
starts, and a block small enough for the cache is read from memory once
instead of ~10 times per step: at n = 1024, P = 2^20 the state is 4 GiB per
copy and memory bandwidth, not arithmetic, bounds the step-by-step simulator.
The per-step norms (consensus distance, error) are sums of squares over the
coordinates: they add over blocks.

[Note: the mixing comes from the mixers themselves] M_t,s is not re-derived
here: the real mixer (mixing.py, with the InProcessCommunicator) mixes a probe
made of one n x n identity block per segment, so column i of block s comes
back as M_t,s e_i; its non-zeros per row (2 for SGP and Crossover, degree + 1
for D-PSGD) become gather indices and coefficients. R is probed the same way
(the identity, or a group mean). Bytes come from a dry run of the same mixer on
meta tensors of the real shape, so they are counted by the communicator exactly
as the step-by-step simulator counts them. OSGP keeps a message in flight (state
besides z), so it is not a memoryless M_t and runs step by step.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import numpy as np
import torch

from shardsched.gossip.comm import InProcessCommunicator
from shardsched.gossip.config import GossipConfig, Sync
from shardsched.gossip.mixing import make_mixer

BLOCKED_SYNCS = frozenset({Sync.ALLREDUCE, Sync.SGP, Sync.DPSGD, Sync.CROSSOVER})
"""Algorithms whose step is a memoryless linear map of z (OSGP holds a message in flight)."""

BLOCK_BYTES = 3 * 2**20
"""Working set per block: z, c and y blocks of n x width. Measured at n = 1024, float32, one thread,
on this machine (AMD Zen 3: 512 KiB L2 per core -- lscpu's "1 MiB" counts both cores -- and 32 MiB L3),
ns per element-step: width 64 (768 KiB) 0.64, 128 0.52, 256 (3 MiB) 0.48-0.50, 512 0.47-0.52; 32
columns (384 KiB, inside L2) 1.2-1.4. A block in L3 streams at ~45 GB/s per core; rows short enough
for L2 pay more per row (two horizontal sums, index loads, loop set-up) than L2 saves."""


class LinearSteps(NamedTuple):
    """Every step's reduction and mixing, as sparse row combinations (result of the probe)."""

    group: int
    """Rows averaged together by reduce_grads (1: no reduction)."""
    idx: np.ndarray
    """(segments, steps, K, n) int64: row i of the mixed segment sums coef[.., k, i] * y[idx[.., k, i]]
    (one segment when every segment mixes alike: all but Crossover)."""
    coef: np.ndarray
    """(segments, steps, K, n), in the problem's dtype (rows with fewer terms are padded with 0)."""
    weight: torch.Tensor
    """(n,) push-sum weights after the last step (ones for the other algorithms)."""
    bytes_per_worker_per_step: float


def _group_size(mixer, n: int, dtype: torch.dtype) -> int:
    """1 if reduce_grads leaves gradients alone, k if it is the mean over contiguous groups of k."""
    eye = torch.eye(n, dtype=dtype)
    r = mixer.reduce_grads(eye)
    k = int((r[0] != 0).sum())
    expected = torch.block_diag(*[torch.full((k, k), 1.0 / k, dtype=dtype)] * (n // k))
    if n % k or not torch.allclose(r, expected):
        raise NotImplementedError("reduce_grads is neither identity nor a contiguous group mean")
    return k


def _sparse_rows(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, n) column indices and values of the non-zeros of every row of m (K: the most in a row;
    rows with fewer get zero coefficients)."""
    terms = max(1, int((m != 0).sum(dim=1).max()))
    _, cols = m.abs().topk(terms, dim=1)
    return cols.T.contiguous(), m.gather(1, cols).T.contiguous()


def _stack_padded(rows: list[list[tuple[torch.Tensor, torch.Tensor]]], n: int, dtype: torch.dtype):
    """(segments, steps, K, n) index and coefficient arrays, K the most terms of any step."""
    terms = max(cols.shape[0] for per_step in rows for cols, _ in per_step)
    segs, steps = len(rows[0]), len(rows)
    idx = np.tile(np.arange(n, dtype=np.int64), (segs, steps, terms, 1))  # padding: own row, weight 0
    coef = np.zeros((segs, steps, terms, n), dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    for t, per_step in enumerate(rows):
        for s, (cols, vals) in enumerate(per_step):
            idx[s, t, :cols.shape[0]], coef[s, t, :cols.shape[0]] = cols.numpy(), vals.numpy()
    return idx, coef


def probe_steps(cfg: GossipConfig, *, n: int, dim: int, bounds: Sequence[tuple[int, int]], steps: int,
                dtype: torch.dtype) -> LinearSteps:
    """Reduction and mixing of every step, read off the real mixer (see the module's notes). Cached:
    it needs no problem data, so `gossip simulate` probes while the problem is being made (command.py)."""
    return _probe_steps(cfg, n, dim, tuple(map(tuple, bounds)), steps, dtype)


@functools.lru_cache(maxsize=8)
def _probe_steps(cfg: GossipConfig, n: int, dim: int, bounds: tuple[tuple[int, int], ...], steps: int,
                 dtype: torch.dtype) -> LinearSteps:
    segs = len(bounds) if cfg.sync is Sync.CROSSOVER else 1  # only Crossover mixes segments differently
    mixer = make_mixer(InProcessCommunicator(n), cfg, [(s * n, (s + 1) * n) for s in range(segs)])
    group = _group_size(mixer, n, dtype)
    probe = torch.eye(n, dtype=dtype).repeat(1, segs)
    rows = []
    for step in range(steps):
        mixed = mixer.mix(probe, step)  # mixed[:, block s] = M_step,s
        rows.append([_sparse_rows(mixed[:, s * n:(s + 1) * n]) for s in range(segs)])
    idx, coef = _stack_padded(rows, n, dtype)
    return LinearSteps(group=group, idx=idx, coef=coef, weight=mixer.weight.clone(),
                       bytes_per_worker_per_step=dry_run_bytes(cfg, n=n, dim=dim, bounds=bounds, steps=steps,
                                                               dtype=dtype))


def dry_run_bytes(cfg: GossipConfig, *, n: int, dim: int, bounds: Sequence[tuple[int, int]], steps: int,
                  dtype: torch.dtype) -> float:
    """Bytes per worker per step, counted by the communicator on a run of the real mixer on meta tensors."""
    comm = InProcessCommunicator(n)
    mixer = make_mixer(comm, cfg, bounds)
    mixer.weight = mixer.weight.to("meta")
    z = torch.empty(n, dim, dtype=dtype, device="meta")
    for step in range(steps):
        z = mixer.mix(z - mixer.reduce_grads(z), step)
    mixer.flush(z)
    return float(comm.bytes_sent.mean()) / max(1, steps)


class BlockedRun(NamedTuple):
    z: torch.Tensor
    """(n, P) final models; (n, 0) when the caller did not keep them."""
    cons_sq: np.ndarray
    """(steps, n) float64: ||z_i - mean z||^2 after every step."""
    err_sq: np.ndarray
    """(steps, n) float64: ||z_i - best||^2 after every step."""
    steps: LinearSteps


def block_layout(bounds: Sequence[tuple[int, int]], *, n: int, itemsize: int,
                 segmented: bool) -> tuple[np.ndarray, ...]:
    """(starts, ends, segment) of blocks that tile every segment, each at most BLOCK_BYTES for z, c and y."""
    width = max(16, BLOCK_BYTES // (3 * n * itemsize) // 16 * 16)
    starts, ends, segment = [], [], []
    for s, (a, b) in enumerate(bounds):
        for start in range(a, b, width):
            starts.append(start)
            ends.append(min(b, start + width))
            segment.append(s if segmented else 0)
    return tuple(np.asarray(v, dtype=np.int64) for v in (starts, ends, segment))


def run_blocked(problem, cfg: GossipConfig, *, steps: int, lrs: Sequence[float],
                bounds: Sequence[tuple[int, int]], best: torch.Tensor | None, models: bool = True) -> BlockedRun:
    """All `steps` of `cfg.sync` on the separable `problem`, block by block (the numba kernel);
    `models=False` skips writing the final (n, P) models (the curves are the same)."""
    import numba

    from shardsched.gossip.kernel import run_blocks
    n, dim, dtype = problem.workers, problem.dim, problem.c.dtype
    lin = probe_steps(cfg, n=n, dim=dim, bounds=bounds, steps=steps, dtype=dtype)
    z = torch.empty(n, dim if models else 0, dtype=dtype)
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    threads = numba.get_num_threads()
    cons = np.zeros((threads, steps, n))
    err = np.zeros((threads, steps, n))
    target = best if best is not None else torch.zeros(dim, dtype=dtype)
    starts, ends, segment = block_layout(bounds, n=n, itemsize=z.element_size(), segmented=lin.idx.shape[0] > 1)
    chunk = numba.set_parallel_chunksize(1)  # one block at a time (kernel.run_blocks' notes)
    try:
        run_blocks(problem.initial().numpy(), problem.c.numpy(), problem.h.numpy(), target.numpy(),
                   np.asarray(lrs, dtype=lin.coef.dtype), lin.group, lin.idx, lin.coef, starts, ends, segment,
                   cons, err, z.numpy())
    finally:
        numba.set_parallel_chunksize(chunk)
    return BlockedRun(z=z, cons_sq=cons.sum(axis=0), err_sq=err.sum(axis=0),
                      steps=lin._replace(weight=lin.weight.clone()))  # the cached probe stays as it was
