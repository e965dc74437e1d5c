"""The mixing rules: how each algorithm combines a worker's model with its peers'.

Every rule works on *rows* (see comm.py): `z` is a (rows, P) tensor of
de-biased flattened models, one row per worker this process stands for. A
training step is, for every algorithm and both for real workers and for the
simulator:

    g = mixer.reduce_grads(g)      # AllReduce: global mean; hierarchical Crossover: group mean
    z = local optimizer step(z, g)
    z = mixer.mix(z, step)         # gossip

SGP keeps the push-sum weight w per row (facebookresearch/stochastic_gradient_push,
gossip/gossiper.py PushSum, and distributed.py: parameters hold the de-biased
z = x / w; before gossip they are re-biased to x = z * w, mixed, and divided by
the new weight). The weight travels in the same message as the parameters: the
message is [x, w] concatenated, as in that code's `mix_out_msg_`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from shardsched.gossip.comm import Communicator, InFlight
from shardsched.gossip.config import GossipConfig, Sync
from shardsched.gossip.topology import derangement, dpsgd_offsets, inverse, sgp_in_peer, sgp_out_peer


class Mixer:
    """Base: no gradient reduction, no mixing (a lone worker); state is a dict of tensors."""

    def __init__(self, comm: Communicator, cfg: GossipConfig, bounds: Sequence[tuple[int, int]]):
        self.comm = comm
        self.cfg = cfg
        self.bounds = tuple(bounds)
        self.weight = torch.ones(len(comm.ranks), dtype=torch.float64)

    def reduce_grads(self, g: torch.Tensor) -> torch.Tensor:
        return g

    def mix(self, z: torch.Tensor, step: int) -> torch.Tensor:
        return z

    def flush(self, z: torch.Tensor) -> torch.Tensor:
        """Absorb any message still in flight (OSGP); others have none."""
        return z

    def state_dict(self) -> dict:
        return {"weight": self.weight.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.weight = state["weight"].clone()


class AllReduceMixer(Mixer):
    """Synchronous data parallelism: the mean gradient everywhere, no mixing."""

    def reduce_grads(self, g):
        return self.comm.group_mean(g, groups=1)


class PushSumMixer(Mixer):
    """SGP: keep 1/2 of (x, w), push 1/2 to the one out-peer of the exponential graph."""

    def _message(self, z: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(z.dtype)[:, None]
        return torch.cat([z * w, w], dim=1) * 0.5  # [x, w] halves: one message, weight included

    def _peers(self, step: int):
        n = self.comm.world
        if n == 1:
            return [None] * len(self.comm.ranks), [None] * len(self.comm.ranks)
        return ([sgp_out_peer(r, n, step) for r in self.comm.ranks],
                [sgp_in_peer(r, n, step) for r in self.comm.ranks])

    def _unpack(self, msg: torch.Tensor) -> torch.Tensor:
        self.weight = msg[:, -1].to(torch.float64)
        return msg[:, :-1] / msg[:, -1:]

    def mix(self, z, step):
        if self.comm.world == 1:
            return z
        msg = self._message(z)
        dst, src = self._peers(step)
        received = self.comm.exchange(msg, dst=dst, src=src).wait()
        return self._unpack(msg + received)


class OverlapPushSumMixer(PushSumMixer):
    """OSGP: the push of step k is in flight while step k+1 computes; what it
    brings is absorbed after step k+1's local update (staleness 1), as
    distributed.py's overlap mode does with its gossip thread."""

    def __init__(self, comm, cfg, bounds):
        super().__init__(comm, cfg, bounds)
        self._pending: InFlight | None = None
        self._inbox: torch.Tensor | None = None

    def _collect(self) -> None:
        if self._pending is not None:
            self._inbox = self._pending.wait()
            self._pending = None

    def _absorb(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Numerator and weight with the inbox added (or as they are)."""
        self._collect()
        w = self.weight.to(z.dtype)[:, None]
        x = z * w
        if self._inbox is not None:
            x = x + self._inbox[:, :-1]
            w = w + self._inbox[:, -1:]
            self._inbox = None
        return x, w

    def mix(self, z, step):
        if self.comm.world == 1:
            return z
        x, w = self._absorb(z)
        msg = torch.cat([x, w], dim=1) * 0.5
        dst, src = self._peers(step)
        self._pending = self.comm.exchange(msg, dst=dst, src=src, async_op=True)
        return self._unpack(msg.clone())

    def flush(self, z):
        if self.comm.world == 1:
            return z
        x, w = self._absorb(z)
        self.weight = w[:, 0].to(torch.float64)
        return x / w

    def state_dict(self):
        self._collect()  # a message in flight becomes the inbox: resume absorbs it exactly as the run would
        return {"weight": self.weight.clone(), "inbox": None if self._inbox is None else self._inbox.clone()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._pending = None
        self._inbox = state.get("inbox")


class DPSGDMixer(Mixer):
    """D-PSGD: x_i <- (x_i + sum of neighbours) / (degree + 1), symmetric circulant graph."""

    def mix(self, z, step):
        offsets = dpsgd_offsets(self.comm.world, self.cfg.topology)
        if not offsets:
            return z
        n = self.comm.world
        flights = [self.comm.exchange(z, dst=[(r + d) % n for r in self.comm.ranks],
                                      src=[(r - d) % n for r in self.comm.ranks], tag=k, async_op=True)
                   for k, d in enumerate(offsets)]
        total = z.clone()
        for f in flights:
            total += f.wait()
        return total / (len(offsets) + 1)


class CrossoverMixer(Mixer):
    """Crossover-SGD: per segment and step, every group root averages that
    segment with a partner root drawn from a load-balanced derangement;
    with groups, gradients are group-averaged first and roots broadcast after
    (Yeosangho/crossover-sgd, imagenet_test.py: crossover / crossover_comm)."""

    def _groups(self) -> int:
        return self.cfg.group_count(self.comm.world)

    def reduce_grads(self, g):
        groups = self._groups()
        return g if groups == self.comm.world else self.comm.group_mean(g, groups=groups)

    def _partners(self, step: int, segment: int):
        groups, size = self._groups(), self.comm.world // self._groups()
        perm = derangement(groups, seed=self.cfg.seed, step=step, segment=segment)
        inv = inverse(perm)
        dst, src = [], []
        for r in self.comm.ranks:
            root = r % size == 0
            dst.append(inv[r // size] * size if root else None)
            src.append(perm[r // size] * size if root else None)
        return dst, src

    def mix(self, z, step):
        groups = self._groups()
        if groups == 1:
            return z
        # on z's device, so a dry run on meta tensors (gossip/blocked.py counts bytes that way) works too
        roots = torch.tensor([r % (self.comm.world // groups) == 0 for r in self.comm.ranks], device=z.device)
        flights = []
        for s, (a, b) in enumerate(self.bounds):
            dst, src = self._partners(step, s)
            flights.append(self.comm.exchange(z[:, a:b].contiguous(), dst=dst, src=src, tag=s, async_op=True))
        out = z.clone()
        for (a, b), f in zip(self.bounds, flights):
            mixed = (z[:, a:b] + f.wait()) / 2
            out[:, a:b] = torch.where(roots[:, None], mixed, z[:, a:b])
        if groups < self.comm.world:
            out = self.comm.group_broadcast(out, groups=groups)
        return out


_MIXERS = {Sync.ALLREDUCE: AllReduceMixer, Sync.SGP: PushSumMixer, Sync.OSGP: OverlapPushSumMixer,
           Sync.DPSGD: DPSGDMixer, Sync.CROSSOVER: CrossoverMixer}


def make_mixer(comm: Communicator, cfg: GossipConfig, bounds: Sequence[tuple[int, int]]) -> Mixer:
    return _MIXERS[cfg.sync](comm, cfg, bounds)
