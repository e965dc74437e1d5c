"""Alpha-beta times of the three collectives, ring and hierarchical.

A ring collective over N workers takes N-1 (AllGather, ReduceScatter) or
2(N-1) (AllReduce) steps; each step pays the link latency alpha and moves
1/N of the message. So (nccl-tests doc/PERFORMANCE.md's bus-bandwidth factors):
    AllGather(M)     = (N-1) alpha + (N-1)/N * M / bw
    ReduceScatter(M) = same
    AllReduce(M)     = 2(N-1) alpha + 2(N-1)/N * M / bw
where M is the unsharded message in bytes and bw the per-worker link bandwidth.
When the world spans nodes, the collective is hierarchical: an inter-node ring
over the G-th part of the message, and an intra-node ring over all of it
(AllGather: inter first then intra; ReduceScatter mirrored; AllReduce = both).
"""
from __future__ import annotations

import enum

from shardsched.cost.device import Cluster, Link


class Collective(str, enum.Enum):
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"


def _ring(link: Link, n: int, nbytes: float, *, passes: int) -> float:
    """`passes` ring sweeps (1 for AG/RS, 2 for AR) of `nbytes` over n workers."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return passes * ((n - 1) * link.alpha_seconds + (n - 1) / n * nbytes / link.bandwidth)


def collective_seconds(kind: Collective, nbytes: float, cluster: Cluster) -> float:
    """Seconds for one collective whose unsharded message is `nbytes`."""
    passes = 2 if kind is Collective.ALL_REDUCE else 1
    g, nodes = cluster.local, cluster.nodes
    dev = cluster.device
    intra = dev.intra_link(kind.value)
    if nodes == 1:
        return _ring(intra, g, nbytes, passes=passes)
    # Hierarchical: each worker's inter-node ring carries 1/g of the message.
    return (_ring(dev.inter, nodes, nbytes / g, passes=passes)
            + _ring(intra, g, nbytes, passes=passes))


def node_seconds(kind: Collective, nbytes: float, cluster: Cluster) -> float:
    """A collective inside one node only (HSDP's shard group, hpZ's post-forward group):
    an intra-node ring over the node's workers, whatever the world."""
    return _ring(cluster.device.intra_link(kind.value), cluster.local, nbytes,
                 passes=2 if kind is Collective.ALL_REDUCE else 1)


def across_seconds(kind: Collective, nbytes: float, cluster: Cluster) -> float:
    """A collective among the workers of equal local rank, one per node (HSDP's
    replicate group): an inter-node ring over `nodes` workers carrying `nbytes`."""
    return _ring(cluster.device.inter, cluster.nodes, nbytes, passes=2 if kind is Collective.ALL_REDUCE else 1)


def block_size_bytes(cluster: Cluster, *, efficiency: float = 0.9) -> int:
    """Smallest AllGather message reaching `efficiency` of asymptotic bandwidth.

    With t(M) = a + c*M, achieved bandwidth M/t(M) reaches efficiency/c when
    M >= efficiency/(1-efficiency) * a/c (= 9 a/c at 90%): a closed form, no search.
    """
    a = collective_seconds(Collective.ALL_GATHER, 0.0, cluster)  # 0 bytes -> 0, so derive a, c:
    t1 = collective_seconds(Collective.ALL_GATHER, 1.0, cluster)
    t2 = collective_seconds(Collective.ALL_GATHER, 2.0**30, cluster)
    c = (t2 - t1) / (2.0**30 - 1.0)
    a = t1 - c
    if c <= 0:
        return 0
    return int(efficiency / (1 - efficiency) * a / c)
