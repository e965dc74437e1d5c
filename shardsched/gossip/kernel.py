"""The blocked simulator's inner loop: every step on one cache-sized block of columns.

Compiled by numba (the `gossip` extra): two fused passes per step over a block that
stays in cache, instead of ~10 torch passes over the whole (n, P) state in memory
(gossip/blocked.py explains why that is exact). Arrays are numpy
views of the torch tensors (`Tensor.numpy()` shares memory).

For every step t of the block [a, b) of the columns (all inside one segment):

    g = (z - c) * h                         # DiagonalLeastSquares.grad
    g = mean of g over rows of the group     # reduce_grads, when group > 1
    y = z - lr[t] * g                        # the SGD step
    z[i] = sum_k coef[t, k, i] * y[idx[t, k, i]]   # mix (and broadcast), as a sparse row combination
    cons[t, i] += sum_j (z[i, j] - mean_i z[i, j])^2;  err[t, i] += sum_j (z[i, j] - best[j])^2
"""
from __future__ import annotations

import numba
import numpy as np


# [Note: dtypes in the kernel] Scalars that meet the arrays (lr, 1/group, 1/n, the
# accumulators' zero) are made in the arrays' dtype (`_scalar`): a Python float or int
# would promote float32 arithmetic to float64 and halve the SIMD width. Numba types
# `float32 * 0 + 1` as float64 (numpy's scalar rules: float32 with int64 gives float64),
# which is how an earlier version summed every row's squares in float64, converting each
# term: 0.99 ns per element-step on one thread at n = 1024, 0.59 ns once the zero was a
# float32 (bench/bench_gossip.py's scale run, docs/design.md "Gossip"). Blocks are copied
# into C-contiguous arrays so numba knows the layout and vectorises the inner loops.


@numba.njit(cache=True)
def _scalar(value, like):
    """`value` in the dtype of the array `like` (see the note above)."""
    return np.full(1, value, dtype=like.dtype)[0]


@numba.njit(cache=True, fastmath=True)
def _consensus(z, mean, zero, cons):
    """cons[i] += ||z_i - mean||^2 (the step-by-step simulator's consensus distance, squared)."""
    n, width = z.shape
    for i in range(n):
        s = zero
        for j in range(width):
            d = z[i, j] - mean[j]
            s += d * d
        cons[i] += s


@numba.njit(cache=True, fastmath=True)
def _local_step(z, c, h, lr, y, mean, zero, cons):
    """y = z - lr * grad, reading z once: the consensus of z (the previous step's result,
    whose column mean is `mean`) is measured in the same pass."""
    n, width = z.shape
    for i in range(n):
        s = zero
        for j in range(width):
            v = z[i, j]
            d = v - mean[j]
            s += d * d
            y[i, j] = v - lr * ((v - c[i, j]) * h[j])
        cons[i] += s


@numba.njit(cache=True, fastmath=True)
def _group_step(z, c, h, lr, group, inv_group, y, gm, mean, zero, cons):
    """y = z - lr * (group mean of the gradients): reduce_grads of AllReduce / hierarchical Crossover.
    The consensus of z is measured in the pass that sums the gradients (one read of z fewer)."""
    n, width = z.shape
    for g0 in range(0, n, group):
        gm[:] = 0
        for i in range(g0, g0 + group):
            s = zero
            for j in range(width):
                v = z[i, j]
                d = v - mean[j]
                s += d * d
                gm[j] += (v - c[i, j]) * h[j]
            cons[i] += s
        for j in range(width):
            gm[j] = lr * (gm[j] * inv_group)
        for i in range(g0, g0 + group):
            for j in range(width):
                y[i, j] = z[i, j] - gm[j]


@numba.njit(cache=True, fastmath=True)
def _mix(y, idx, coef, best, z, mean, inv_n, zero, err):
    """z = the mixed rows of y; err[i] += ||z_i - best||^2; mean = the column means of z.

    The last two terms are summed in the pass that measures (SGP and Crossover have
    two terms: one pass); terms before them (D-PSGD's wider neighbourhoods) go into z first."""
    n, width = z.shape
    terms = idx.shape[0]
    partial = terms > 2
    mean[:] = 0
    for i in range(n):
        for k in range(terms - 2):
            src, w = idx[k, i], coef[k, i]
            for j in range(width):
                z[i, j] = (z[i, j] if k > 0 else zero) + w * y[src, j]
        s0, w0 = idx[max(0, terms - 2), i], coef[max(0, terms - 2), i]
        s1, w1 = idx[terms - 1, i], (coef[terms - 1, i] if terms > 1 else zero)  # one term: s1 = s0, w1 = 0
        e = zero
        for j in range(width):
            v = (z[i, j] if partial else zero) + w0 * y[s0, j] + w1 * y[s1, j]
            z[i, j] = v
            d = v - best[j]
            e += d * d
            mean[j] += v
        err[i] += e
    for j in range(width):
        mean[j] *= inv_n


@numba.njit(cache=True, fastmath=True)
def _run_block(z, c, h, best, lrs, group, idx, coef, cons, err):
    n, width = z.shape
    y = np.empty_like(z)
    gm = np.empty(width, dtype=z.dtype)
    mean = np.zeros(width, dtype=z.dtype)
    inv_group, inv_n, zero = _scalar(1 / group, z), _scalar(1 / n, z), _scalar(0, z)
    steps = lrs.shape[0]
    for t in range(steps):
        # the consensus of z before step t is the one after step t - 1 (at t = 0: into a scratch row)
        before = cons[t - 1] if t > 0 else np.zeros(n, dtype=cons.dtype)
        if group > 1:
            _group_step(z, c, h, lrs[t], group, inv_group, y, gm, mean, zero, before)
        else:
            _local_step(z, c, h, lrs[t], y, mean, zero, before)
        _mix(y, idx[t], coef[t], best, z, mean, inv_n, zero, err[t])
    _consensus(z, mean, zero, cons[steps - 1])


@numba.njit(cache=True, parallel=True)
def run_blocks(z0, c, h, best, lrs, group, idx, coef, starts, ends, segment, cons, err, out):
    """Run every step on every block [starts[b], ends[b]) of segment[b], every worker starting at z0 (P,);
    the final models go to out (n, P), unless out has no columns (the caller does not keep them).

    Each thread adds into its own slice cons[thread]/err[thread] (threads, steps, n), which the
    caller sums. [Note: no (n, P) initial state] Every worker starts at the same z0, so a block is
    filled from z0 instead of being read from an (n, P) copy: at n = 1024, P = 2^20 writing that
    copy cost 4 s (4 GiB, first touch). [Note: blocks are handed out one at a time] The caller sets
    numba's parallel chunk size to 1, so a thread takes the next block when it is done: on a shared
    machine a thread whose core is busy does fewer blocks instead of holding up the others."""
    n = c.shape[0]
    for b in numba.prange(starts.shape[0]):
        tid = numba.get_thread_id()
        a, e, s = starts[b], ends[b], segment[b]
        zb = np.empty((n, e - a), dtype=c.dtype)
        zb[:] = z0[a:e]
        _run_block(zb, np.ascontiguousarray(c[:, a:e]), h[a:e].copy(), best[a:e].copy(), lrs, group,
                   idx[s], coef[s], cons[tid], err[tid])
        if out.shape[1]:
            out[:, a:e] = zb
