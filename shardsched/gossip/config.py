"""What a gossip run is given: the sync algorithm, segments, groups, topology.

Vocabulary (docs/design.md, "Gossip"): sync = how replicas agree when they are
not sharded; segment = a contiguous slice of the flattened parameters that is
gossiped with one partner; group = contiguous ranks that all-reduce inside and
gossip through their root (rank 0 of the group).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from shardsched.errors import UsageError


class Sync(str, enum.Enum):
    ALLREDUCE = "allreduce"
    """Synchronous data parallelism: gradients averaged over all workers (PyTorch DDP)."""
    SGP = "sgp"
    """Stochastic Gradient Push (Assran et al., ICML 2019): push-sum on a time-varying directed graph."""
    OSGP = "osgp"
    """Overlap SGP: the push overlaps the next step's compute; received mass is absorbed one step late."""
    DPSGD = "dpsgd"
    """D-PSGD (Lian et al., NeurIPS 2017): symmetric doubly-stochastic mixing with fixed neighbours."""
    CROSSOVER = "crossover"
    """Crossover-SGD (Yeo et al.): per-segment pairwise averaging over a load-balanced random derangement."""


class Topology(str, enum.Enum):
    RING = "ring"
    """Neighbours r-1 and r+1."""
    EXPONENTIAL = "exponential"
    """Neighbours r +- 2^j for every j with 2^j < n."""


SYNC_FORMS = ", ".join(s.value for s in Sync)


def parse_sync(text: str) -> Sync:
    try:
        return Sync(text.strip().lower())
    except ValueError:
        raise UsageError(f"unknown sync algorithm {text!r}; accepted: {SYNC_FORMS}") from None


def parse_syncs(text: str) -> tuple[Sync, ...]:
    """A comma-separated list such as "crossover,sgp,dpsgd,allreduce"."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"--sync needs at least one algorithm; accepted: {SYNC_FORMS}")
    return tuple(parse_sync(t) for t in items)


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    sync: Sync = Sync.SGP
    """The algorithm that keeps the replicas together."""
    segments: int | str = 1
    """Crossover: S contiguous segments (an int), or "coarse" (one per top-level child module)
    or "fine" (one per second-level module, e.g. one per transformer block)."""
    groups: int = 0
    """Crossover: number of contiguous rank groups G (0: every rank is its own group)."""
    topology: Topology = Topology.RING
    """D-PSGD's neighbours."""
    seed: int = 0
    """Seeds Crossover's derangements (identical on every rank)."""

    def group_count(self, world: int) -> int:
        """Groups actually used: G, or the world when G is 0."""
        return self.groups or world


def check_config(cfg: GossipConfig, *, world: int) -> None:
    """UsageError (one line) for a configuration the world cannot run."""
    if isinstance(cfg.segments, int) and cfg.segments < 1:
        raise UsageError(f"--segments must be at least 1 (or coarse | fine), got {cfg.segments}")
    if isinstance(cfg.segments, str) and cfg.segments not in ("coarse", "fine"):
        raise UsageError(f"--segments {cfg.segments!r}: accepted: a positive integer, coarse, fine")
    if cfg.groups < 0 or (cfg.groups and world % cfg.groups):
        raise UsageError(f"--groups {cfg.groups} must divide the number of workers ({world})")
    if cfg.groups and cfg.sync is not Sync.CROSSOVER:
        raise UsageError(f"--groups applies to --sync crossover only, not {cfg.sync.value}")


def parse_segments(text: str | int) -> int | str:
    """--segments: a positive integer, coarse or fine."""
    if isinstance(text, int):
        return text
    if text in ("coarse", "fine"):
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--segments {text!r}: accepted: a positive integer, coarse, fine") from None
