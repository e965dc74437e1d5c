"""GossipDataParallel: wrap any model so its replicas agree by gossip (or AllReduce).

    gdp = GossipDataParallel(model, sync="sgp", group=pg)
    loss = loss_fn(gdp(x), y); loss.backward()
    gdp.step(optimizer, step)          # reduce gradients, optimizer.step(), mix

The parameters always hold the de-biased model z = x / w that forward and
backward use (SGP). `sync="allreduce"` is plain PyTorch DDP: gradients are
averaged by DDP's own bucketed all-reduce during backward; nothing is rewritten.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from shardsched.gossip.comm import Communicator, ProcessGroupCommunicator, allreduce_bytes
from shardsched.gossip.config import GossipConfig, Sync, Topology, check_config, parse_segments, parse_sync
from shardsched.gossip.mixing import make_mixer
from shardsched.gossip.segments import segment_bounds


class GossipDataParallel(torch.nn.Module):
    """Decentralised data parallelism around `module` on the process group `group`."""

    def __init__(self, module: torch.nn.Module, *, sync: str | Sync = Sync.SGP,
                 group: dist.ProcessGroup | None = None, comm: Communicator | None = None,
                 segments: int | str = 1, groups: int = 0, topology: str | Topology = Topology.RING,
                 seed: int = 0):
        super().__init__()
        if group is None and comm is None:
            raise ValueError("pass the process group (group=) or a communicator (comm=)")
        cfg = GossipConfig(sync=parse_sync(sync) if isinstance(sync, str) else sync,
                           segments=parse_segments(segments), groups=groups,
                           topology=Topology(topology), seed=seed)
        self.comm = comm or ProcessGroupCommunicator(group, groups=(cfg.groups,) if cfg.groups else ())
        check_config(cfg, world=self.comm.world)
        self.cfg = cfg
        self.bounds = segment_bounds(module, cfg.segments)  # UsageError for too many segments
        self.mixer = make_mixer(self.comm, cfg, self.bounds)
        self._ddp_bytes = 0.0
        if cfg.sync is Sync.ALLREDUCE:
            self.module = torch.nn.parallel.DistributedDataParallel(module, process_group=group)
        else:
            self.module = module

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped model itself (without DDP)."""
        return self.module.module if self.cfg.sync is Sync.ALLREDUCE else self.module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _params(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def reduce_grads(self) -> None:
        """Average gradients where the algorithm asks for it (hierarchical Crossover: in the group)."""
        if self.cfg.sync is Sync.ALLREDUCE:
            # DDP averaged them during backward; count its ring all-reduce bytes.
            nbytes = sum(p.numel() * p.element_size() for p in self._params())
            self._ddp_bytes += allreduce_bytes(nbytes, self.comm.world)
            return
        params = [p for p in self._params() if p.grad is not None]
        if len(params) != len(self._params()):
            raise RuntimeError("every parameter needs a gradient before gossip (run backward first)")
        g = parameters_to_vector([p.grad for p in params])[None]
        reduced = self.mixer.reduce_grads(g)
        if reduced is not g:
            vector_to_parameters(reduced[0], [p.grad for p in params])

    @torch.no_grad()
    def mix(self, step: int) -> None:
        """Gossip after the local optimizer step of `step`."""
        params = self._params()
        z = parameters_to_vector(params)[None]
        vector_to_parameters(self.mixer.mix(z, step)[0], params)

    @torch.no_grad()
    def flush(self) -> None:
        """Absorb messages still in flight (OSGP), e.g. before evaluating the final model."""
        params = self._params()
        vector_to_parameters(self.mixer.flush(parameters_to_vector(params)[None])[0], params)

    def step(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """reduce_grads, optimizer.step(), mix: one training step's communication."""
        self.reduce_grads()
        optimizer.step()
        self.mix(step)

    @property
    def bytes_sent(self) -> float:
        """Bytes this rank has sent so far (gossip messages and collectives)."""
        return float(self.comm.bytes_sent.sum()) + self._ddp_bytes

    def gossip_state(self) -> dict:
        """What a checkpoint must hold beyond model and optimizer: push-sum weight, OSGP inbox."""
        return self.mixer.state_dict()

    def load_gossip_state(self, state: dict) -> None:
        self.mixer.load_state_dict(state)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return parameters_to_vector(list(model.parameters())).detach()


def param_sizes(model: torch.nn.Module) -> Sequence[int]:
    return [p.numel() for p in model.parameters()]
