"""What each strategy costs per unit: shard count, collectives, memory held across the step.

One table for the simulator (`sim.timeline`, `sim.memory`), the MILP and greedy
(`solve.milp`, `solve.greedy`), so the three can never disagree.

[Note: the node-aware strategies]
- hybrid_shard / hybrid_shard_grad_op (HSDP, MiCS: Zhang et al. 2022): FSDP2 on a
  (nodes, gpus_per_node) mesh shards inside a node and replicates across nodes.
  AllGathers are intra-node; the gradient is reduce-scattered inside the node, then
  its 1/g shard all-reduced across nodes (`_fsdp_collectives.foreach_reduce`:
  reduce-scatter over the shard group, all-reduce over the replicate group).
- full_shard_node (ZeRO++ hpZ: Wang et al. 2023; FSDP2 `reshard_after_forward=g`):
  sharded over the world; after forward FSDP2 keeps a 1/g slice of the gathered
  (compute-dtype) parameters (`FSDPParam.to_sharded_post_forward`) until the backward
  AllGather's copy-out (`to_unsharded` frees it), and that AllGather runs over the
  node's g workers only. Reduce-scatter is over the world, as full_shard.
On one node (or one worker per node) these are full_shard / shard_grad_op with extra
steps, so the planner offers them only when nodes > 1 and gpus_per_node > 1.
"""
from __future__ import annotations

from shardsched.cost.comm import Collective, across_seconds, collective_seconds, node_seconds
from shardsched.cost.device import Cluster
from shardsched.cost.memory import shards
from shardsched.core.types import Strategy

OLD = (Strategy.REPLICATE, Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD)
NODE_AWARE = (Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP)
HYBRID = (Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP)


def all_reduces(strategy: Strategy) -> bool:
    """Whether FSDP2 all-reduces the gradient across replicas after reducing it (replicate:
    a shard group of one on a (world, 1) mesh; hybrid_*): it keeps that buffer across layers
    (`FSDPParamGroup._all_reduce_state`), so reduced gradients added into held ones still hold
    it (`sim.scenario.Scenario.accumulates_sharded`)."""
    return strategy is Strategy.REPLICATE or strategy in HYBRID


def strategies_for(cluster: Cluster) -> tuple[Strategy, ...]:
    """The strategies worth offering on this cluster (see the note above)."""
    if cluster.nodes > 1 and cluster.local > 1:
        return OLD + NODE_AWARE
    return OLD


def shard_count(strategy: Strategy, cluster: Cluster) -> int:
    """How many ways a unit's persistent state is split."""
    return shards(strategy, cluster.world, local=cluster.local)


def gather_seconds(strategy: Strategy, nbytes: float, cluster: Cluster, *, backward: bool) -> float:
    """One AllGather of a unit whose unsharded parameters are `nbytes`."""
    if strategy is Strategy.REPLICATE:
        return 0.0  # a shard group of one: nothing on the wire
    if strategy in HYBRID or (backward and strategy is Strategy.FULL_SHARD_NODE):
        return node_seconds(Collective.ALL_GATHER, nbytes, cluster)
    return collective_seconds(Collective.ALL_GATHER, nbytes, cluster)


def reduce_seconds(strategy: Strategy, nbytes: float, cluster: Cluster) -> float:
    """The gradient reduction of a unit whose full gradient is `nbytes`."""
    if strategy is Strategy.REPLICATE:
        return collective_seconds(Collective.ALL_REDUCE, nbytes, cluster)
    if strategy in HYBRID:
        return (node_seconds(Collective.REDUCE_SCATTER, nbytes, cluster)
                + across_seconds(Collective.ALL_REDUCE, nbytes / cluster.local, cluster))
    return collective_seconds(Collective.REDUCE_SCATTER, nbytes, cluster)


def reduce_kind(strategy: Strategy) -> Collective:
    return Collective.ALL_REDUCE if strategy is Strategy.REPLICATE else Collective.REDUCE_SCATTER


def held_after_forward(strategy: Strategy, unsharded_bytes: int, cluster: Cluster) -> int:
    """Bytes a unit keeps from the end of its forward until its backward gathers:
    the whole gathered copy (no reshard), a node-sized slice (hpZ), or nothing."""
    if strategy is Strategy.FULL_SHARD_NODE:
        return unsharded_bytes // cluster.local
    return 0 if strategy.gathers_for_backward else unsharded_bytes
