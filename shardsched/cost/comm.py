"""Alpha-beta times of the three collectives, ring and hierarchical.

A ring collective over N workers takes N-1 (AllGather, ReduceScatter) or
2(N-1) (AllReduce) steps; each step pays the link latency alpha and moves
1/N of the message. So (nccl-tests doc/PERFORMANCE.md's bus-bandwidth factors):
    AllGather(M)     = (N-1) alpha + (N-1)/N * M / bw
    ReduceScatter(M) = same
    AllReduce(M)     = 2(N-1) alpha + 2(N-1)/N * M / bw
where M is the unsharded message in bytes and bw the per-worker link bandwidth.
When the world spans nodes (G workers per node):
* AllGather and ReduceScatter run as NCCL runs them, on flat rings through every
  worker (NVIDIA/nccl#530: "rings are flat and span across intra- and inter-node
  connections"; #1594: AllGather/ReduceScatter have no tree, ring latency is O(N)).
  One ring step waits for its slowest hop, the inter-node one, so the latency is
  (N-1) inter alpha. The bytes are those of the two-level bound: each node's G
  NICs carry one ring channel each, so a worker's NIC moves 1/G of the message
  across nodes, and its intra-node link all of it.
* AllReduce is priced as the two-level algorithm NCCL's tree approximates (reduce
  in the node, all-reduce across nodes, broadcast in the node; #530): an
  inter-node ring over the G-th part of the message plus an intra-node ring.
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
    if kind is Collective.ALL_REDUCE:  # two-level: each worker's inter-node ring carries 1/g
        return (_ring(dev.inter, nodes, nbytes / g, passes=passes)
                + _ring(intra, g, nbytes, passes=passes))
    if nbytes <= 0:
        return 0.0
    # One flat ring of `world` steps, each paced by its inter-node hop; bytes as above.
    return ((cluster.world - 1) * dev.inter.alpha_seconds + (nodes - 1) / nodes * nbytes / g / dev.inter.bandwidth
            + (g - 1) / g * nbytes / intra.bandwidth)


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
