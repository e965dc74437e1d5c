"""The communicator: the one interface every gossip algorithm talks through.

A communicator holds *rows*: a tensor whose first dimension runs over the
workers this process stands for. On real process groups that is one row (this
rank); in the simulator it is all N virtual workers in one process. The mixing
rules (mixing.py) only ever call the methods below, so real runs and the
simulator share one communication path and can be compared bit for bit.

- `exchange(rows, dst=, src=)`: every row sends itself to `dst[i]` and receives
  one message from `src[i]` (None: the row sits this exchange out). On process
  groups this is `dist.batch_isend_irecv`; in process it is an index gather.
- `group_mean(rows, groups=G)` / `group_broadcast(rows, groups=G)`: all-reduce
  (mean) or broadcast from the root inside each of G contiguous rank groups
  (`dist.all_reduce` / `dist.broadcast` on subgroups made once, up front).

Each communicator counts the bytes every row sends (collectives at their ring
cost: AllReduce 2(k-1)/k of the message, broadcast (k-1)/k, as nccl-tests'
bus-bandwidth factors in cost/comm.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Sequence

import torch
import torch.distributed as dist

from shardsched.errors import UsageError


class InFlight(NamedTuple):
    """An exchange that may still be running (result of work in flight)."""

    received: torch.Tensor
    """Where the messages land: valid only after `wait()`; rows that received nothing hold zeros."""
    works: tuple
    """The torch.distributed work handles (empty in process)."""
    sending: tuple = ()
    """The tensors being sent, kept alive until the sends complete."""

    def wait(self) -> torch.Tensor:
        """Block until the messages arrived. Waiting twice is fine in process; for
        process-group work a gloo send waited on twice blocks, so callers wait once
        (exchange(async_op=False) hands back a flight with no works left)."""
        for w in self.works:
            w.wait()
        return self.received


def allreduce_bytes(nbytes: float, k: int) -> float:
    """Bytes one worker sends in a ring AllReduce of `nbytes` over k workers."""
    return 2 * (k - 1) / k * nbytes if k > 1 else 0.0


def broadcast_bytes(nbytes: float, k: int) -> float:
    """Bytes one worker sends, on average, in a pipelined ring broadcast."""
    return (k - 1) / k * nbytes if k > 1 else 0.0


class Communicator(ABC):
    """What gossip needs from the transport; rows are workers `self.ranks`."""

    world: int
    """Workers in all."""
    ranks: tuple[int, ...]
    """Group ranks of the rows this communicator holds, in row order."""
    bytes_sent: torch.Tensor
    """float64 per row: bytes each row has sent so far."""

    def _init_counters(self) -> None:
        self.bytes_sent = torch.zeros(len(self.ranks), dtype=torch.float64)

    def check_groups(self, groups: int) -> int:
        if groups < 1 or self.world % groups:
            raise UsageError(f"--groups {groups} must divide the number of workers ({self.world})")
        return self.world // groups

    @abstractmethod
    def exchange(self, rows: torch.Tensor, *, dst: Sequence[int | None], src: Sequence[int | None],
                 tag: int = 0, async_op: bool = False) -> InFlight:
        """Row i sends `rows[i]` to rank dst[i] and receives from rank src[i]."""

    @abstractmethod
    def group_mean(self, rows: torch.Tensor, *, groups: int) -> torch.Tensor:
        """Mean of the rows of each of `groups` contiguous rank groups, for every member."""

    @abstractmethod
    def group_broadcast(self, rows: torch.Tensor, *, groups: int) -> torch.Tensor:
        """Every member of a group gets its root's (first rank's) row."""

    def _count_exchange(self, rows: torch.Tensor, dst: Sequence[int | None]) -> None:
        per_row = rows[0].numel() * rows.element_size() if len(rows) else 0
        active = torch.tensor([d is not None for d in dst], dtype=torch.float64)
        self.bytes_sent += active * per_row

    def _count_collective(self, rows: torch.Tensor, nbytes_fn, k: int) -> None:
        self.bytes_sent += nbytes_fn(rows[0].numel() * rows.element_size(), k)


class InProcessCommunicator(Communicator):
    """N virtual workers in one process: row r is worker r."""

    def __init__(self, world: int):
        self.world = world
        self.ranks = tuple(range(world))
        self._init_counters()

    def exchange(self, rows, *, dst, src, tag=0, async_op=False):
        self._count_exchange(rows, dst)
        active = [i for i, s in enumerate(src) if s is not None]
        received = torch.zeros_like(rows)
        if active:
            idx = torch.tensor(active)
            received[idx] = rows[torch.tensor([src[i] for i in active])]
        return InFlight(received=received, works=())

    def group_mean(self, rows, *, groups):
        size = self.check_groups(groups)
        self._count_collective(rows, allreduce_bytes, size)
        shaped = rows.reshape(groups, size, *rows.shape[1:])
        return shaped.mean(dim=1, keepdim=True).expand_as(shaped).reshape(rows.shape).clone()

    def group_broadcast(self, rows, *, groups):
        size = self.check_groups(groups)
        self._count_collective(rows, broadcast_bytes, size)
        shaped = rows.reshape(groups, size, *rows.shape[1:])
        return shaped[:, :1].expand_as(shaped).reshape(rows.shape).clone()


class ProcessGroupCommunicator(Communicator):
    """One row: this rank of `group`. Subgroups for `groups` are made here, once,
    by every rank in the same order (dist.new_group is collective)."""

    def __init__(self, group: dist.ProcessGroup, *, groups: Sequence[int] = ()):
        self.group = group
        self.world = dist.get_world_size(group)
        self.ranks = (dist.get_rank(group),)
        self._global = [dist.get_global_rank(group, r) for r in range(self.world)]
        self._subgroups: dict[int, dist.ProcessGroup] = {}
        for g in sorted(set(groups)):
            size = self.check_groups(g)
            if g == 1 or size == 1:
                continue
            made = [dist.new_group(ranks=self._global[i * size:(i + 1) * size]) for i in range(g)]
            self._subgroups[g] = made[self.ranks[0] // size]
        self._init_counters()

    def _subgroup(self, groups: int) -> tuple[dist.ProcessGroup | None, int]:
        size = self.check_groups(groups)
        if size == 1:
            return None, 1
        if groups == 1:
            return self.group, size
        if groups not in self._subgroups:
            raise ValueError(f"communicator was not built for {groups} groups (pass groups=({groups},))")
        return self._subgroups[groups], size

    def exchange(self, rows, *, dst, src, tag=0, async_op=False):
        self._count_exchange(rows, dst)
        received = torch.zeros_like(rows)
        ops, sending = [], ()
        if dst[0] is not None:
            sending = (rows[0].contiguous(),)
            ops.append(dist.P2POp(dist.isend, sending[0], self._global[dst[0]], self.group, tag))
        if src[0] is not None:
            ops.append(dist.P2POp(dist.irecv, received[0], self._global[src[0]], self.group, tag))
        works = tuple(dist.batch_isend_irecv(ops)) if ops else ()
        flight = InFlight(received=received, works=works, sending=sending)
        if not async_op:
            flight.wait()
            return InFlight(received=received, works=())
        return flight

    def group_mean(self, rows, *, groups):
        pg, size = self._subgroup(groups)
        if pg is None:
            return rows.clone()
        self._count_collective(rows, allreduce_bytes, size)
        out = rows.clone()
        dist.all_reduce(out, group=pg)  # gloo has no AVG: sum, then divide
        return out.div_(size)

    def group_broadcast(self, rows, *, groups):
        pg, size = self._subgroup(groups)
        if pg is None:
            return rows.clone()
        self._count_collective(rows, broadcast_bytes, size)
        out = rows.clone()
        root = self._global[(self.ranks[0] // size) * size]
        dist.broadcast(out, src=root, group=pg)
        return out
