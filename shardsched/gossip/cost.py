"""Predicted communication seconds per step of each sync, from the alpha-beta model.

The links and the ring AllReduce come from cost/device.py and cost/comm.py.
A point-to-point message of M bytes on a link costs alpha + M / bandwidth
(one ring step of cost/comm.py). Two layouts are predicted:
- flat: every worker on its own node, all traffic on the inter-node link;
- hierarchical: `gpus_per_node` workers per node; AllReduce is cost/comm.py's
  hierarchical ring, Crossover uses one group per node (all-reduce and
  broadcast on the intra-node link, gossip between node roots on the inter link).
Gossip messages of the exponential graph go to r + 2^j: inside the node when
2^j < gpus_per_node (for most ranks), otherwise across nodes.
"""
from __future__ import annotations

from shardsched.cost.comm import Collective, collective_seconds
from shardsched.cost.device import Cluster, DeviceSpec, Link
from shardsched.gossip.config import Sync, Topology
from shardsched.gossip.topology import dpsgd_offsets, exponential_rounds


def _p2p(link: Link, nbytes: float) -> float:
    return link.alpha_seconds + nbytes / link.bandwidth


def _ring(link: Link, k: int, nbytes: float, passes: int) -> float:
    if k <= 1:
        return 0.0
    return passes * ((k - 1) * link.alpha_seconds + (k - 1) / k * nbytes / link.bandwidth)


def predicted_comm_seconds(sync: Sync, *, world: int, nbytes: float, device: DeviceSpec, gpus_per_node: int,
                           segments: int = 1, topology: Topology = Topology.RING) -> float:
    """Seconds of communication per step for `world` workers, model of `nbytes`."""
    local = min(world, gpus_per_node)
    if world == 1:
        return 0.0
    if sync is Sync.ALLREDUCE:
        return collective_seconds(Collective.ALL_REDUCE, nbytes, Cluster(world=world, gpus_per_node=local,
                                                                         device=device))
    if sync in (Sync.SGP, Sync.OSGP):
        rounds = exponential_rounds(world)
        links = [device.intra if 2 ** j < local else device.inter for j in range(rounds)]
        return sum(_p2p(link, nbytes + 8) for link in links) / rounds  # the weight rides along: 8 bytes
    if sync is Sync.DPSGD:
        offsets = dpsgd_offsets(world, topology)
        # messages to all neighbours leave together and share the link
        return max(l.alpha_seconds for l in (device.intra, device.inter)) + sum(
            nbytes / (device.intra if min(d, world - d) < local else device.inter).bandwidth for d in offsets)
    # Crossover: one group per node; groups of one worker when a node holds one.
    roots = world // local
    gossip = 0.0 if roots == 1 else segments * device.inter.alpha_seconds + nbytes / device.inter.bandwidth
    return _ring(device.intra, local, nbytes, 2) + gossip + _ring(device.intra, local, nbytes, 1)
