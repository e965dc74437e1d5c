"""Who talks to whom: peers of every algorithm, and the mixing matrices they imply.

Everything here is a pure function of (rank, world, step[, seed]), so every rank
(and the simulator) computes the same graph without communicating.

- SGP: the time-varying directed exponential graph of facebookresearch/
  stochastic_gradient_push (gossip/graph_manager.py, NPeerDynamicDirectedExponentialGraph
  with one peer per iteration): rank r sends to r + 2^j mod n, j cycling through
  0 .. floor(log2(n-1)) one step at a time.
- D-PSGD: a static symmetric circulant graph (ring: offsets +-1; exponential:
  offsets +-2^j), uniform weights 1/(degree+1), so the mixing is doubly stochastic.
- Crossover: a load-balanced random derangement of the group roots per segment
  and step, following Yeosangho/crossover-sgd (imagenet_test.py, select_layer):
  root i picks uniformly among roots not yet picked and not itself, and the
  second-to-last root is forced to take the last one if still free, so the last
  root never has only itself left.
"""
from __future__ import annotations

import functools
import math
import random

import numpy as np

from shardsched.gossip.config import Topology


# ---------------------------------------------------------------- SGP

def exponential_rounds(world: int) -> int:
    """Distinct offsets 2^0 .. 2^floor(log2(n-1)) the directed exponential graph cycles through."""
    return int(math.floor(math.log2(world - 1))) + 1 if world > 2 else 1


def sgp_out_peer(rank: int, world: int, step: int) -> int:
    """The one out-peer of `rank` at `step`: r + 2^(step mod rounds)."""
    return (rank + 2 ** (step % exponential_rounds(world))) % world


def sgp_in_peer(rank: int, world: int, step: int) -> int:
    """The one in-peer: the rank whose out-peer is `rank`."""
    return (rank - 2 ** (step % exponential_rounds(world))) % world


# ---------------------------------------------------------------- D-PSGD

def dpsgd_offsets(world: int, topology: Topology) -> tuple[int, ...]:
    """Distinct non-zero offsets d (mod n) of the symmetric neighbour set {r + d}."""
    if world == 1:
        return ()
    base = [1] if topology is Topology.RING else [2 ** j for j in range(exponential_rounds(world))]
    offsets = sorted({d % world for b in base for d in (b, -b)} - {0})
    return tuple(offsets)


# ---------------------------------------------------------------- Crossover

@functools.lru_cache(maxsize=512)
def derangement(roots: int, *, seed: int, step: int, segment: int) -> tuple[int, ...]:
    """partner[i]: the root that root i receives segment `segment` from at `step`.

    A permutation without fixed points drawn by the load-balanced rule; the RNG
    is seeded by (seed, step, segment) only, so every rank draws the same one
    and nothing needs saving for resume. Cached (a pure function): the blocked
    simulator's probe and byte count draw the same ones (1.3 ms each at 1024 roots)."""
    if roots < 2:
        return tuple(range(roots))
    rng = random.Random(f"crossover:{seed}:{step}:{segment}")
    # `free` holds the roots not yet picked (swap-remove keeps each draw O(1));
    # `where[j]` is j's index in `free`, or -1 once picked.
    free, where = list(range(roots)), list(range(roots))
    chosen: list[int] = []
    for i in range(roots):
        if i == roots - 2 and where[roots - 1] >= 0:
            pick = roots - 1  # forced: otherwise the last root could be left with only itself
        elif where[i] >= 0:  # uniform over the free roots except i itself
            k = rng.randrange(len(free) - 1)
            pick = free[k + (k >= where[i])]
        else:
            pick = free[rng.randrange(len(free))]
        last, at = free[-1], where[pick]
        free[at], where[last] = last, at
        free.pop()
        where[pick] = -1
        chosen.append(pick)
    return tuple(chosen)


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    """inverse[j] = i where perm[i] = j: whom root j sends to."""
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)


# ---------------------------------------------------------------- mixing matrices

def sgp_matrix(world: int, step: int) -> np.ndarray:
    """Column-stochastic W with x_new = W x: keep 1/2, push 1/2 to the out-peer."""
    w = np.zeros((world, world))
    for r in range(world):
        w[r, r] += 0.5
        w[sgp_out_peer(r, world, step), r] += 0.5
    return w if world > 1 else np.ones((1, 1))


def dpsgd_matrix(world: int, topology: Topology) -> np.ndarray:
    offsets = dpsgd_offsets(world, topology)
    w = np.zeros((world, world))
    for r in range(world):
        for d in (0, *offsets):
            w[r, (r + d) % world] = 1.0 / (len(offsets) + 1)
    return w


def crossover_matrix(world: int, groups: int, *, seed: int, step: int, segment: int = 0) -> np.ndarray:
    """Mixing of one segment over all ranks: pairwise average of roots, then group broadcast;
    gradients are group-averaged, so a group acts as one replica."""
    size = world // groups
    perm = derangement(groups, seed=seed, step=step, segment=segment)
    root_mix = np.eye(groups) * 0.5
    for i, j in enumerate(perm):
        root_mix[i, j] += 0.5
    if groups == 1:
        root_mix = np.ones((1, 1))
    if size == 1:
        return root_mix
    # rank-level: every member of group g takes root g's mixed value, a mean over the group's (equal) replicas:
    # expand (world x groups, ones) @ root_mix @ collapse (groups x world, 1/size), whose entries have one
    # non-zero term each, i.e. kron(root_mix, 1/size), without two world x world products.
    return np.kron(root_mix, np.full((size, size), 1.0 / size))


def allreduce_matrix(world: int) -> np.ndarray:
    return np.full((world, world), 1.0 / world)


def spectral_gap(matrices: list[np.ndarray]) -> float:
    """1 - |lambda_2| of the product of one period of mixing matrices, per step.

    For a time-varying graph the per-period product is what contracts the
    disagreement; taking its |lambda_2|^(1/period) gives a per-step rate.
    The second eigenvalue is that of the product restricted to the disagreement
    space (I - 11^T/n), so column- and row-stochastic matrices both work."""
    n = matrices[0].shape[0]
    if n == 1:
        return 1.0
    prod = np.eye(n)
    for m in matrices:
        prod = m @ prod
    proj = np.eye(n) - np.full((n, n), 1.0 / n)
    rate = float(np.max(np.abs(np.linalg.eigvals(proj @ prod @ proj))))
    return 1.0 - rate ** (1.0 / len(matrices))
