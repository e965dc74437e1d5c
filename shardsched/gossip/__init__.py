"""Decentralised data parallelism: SGP, overlap-SGP, D-PSGD, Crossover-SGD, and an
AllReduce baseline; one communicator interface for real process groups and the
in-process simulator (docs/design.md, "Gossip")."""
from shardsched.gossip.config import GossipConfig, Sync, Topology
from shardsched.gossip.parallel import GossipDataParallel

__all__ = ["GossipConfig", "GossipDataParallel", "Sync", "Topology"]
