"""Worker functions for the gossip tests (module-level so spawned workers can unpickle them)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from shardsched.gossip.comm import ProcessGroupCommunicator
from shardsched.gossip.config import GossipConfig, Sync, Topology
from shardsched.gossip.mixing import make_mixer
from shardsched.gossip.parallel import GossipDataParallel
from shardsched.gossip.problems import LeastSquares, PiecewiseLinear, local_loss
from shardsched.gossip.topology import derangement

BOUNDS = [(0, 2), (2, 5), (5, 6)]  # three segments of a 6-element model


def _gather(t: torch.Tensor, group) -> torch.Tensor:
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return torch.stack(out)


def invariants_worker(ctx, out: str) -> None:
    """Mix random models by every rule on real workers; rank 0 saves every replica before and after."""
    group, n = ctx.mesh.get_group(), ctx.world
    comm = ProcessGroupCommunicator(group, groups=(2,))
    z0 = torch.randn(1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(ctx.rank))
    res = {"z0": _gather(z0[0], group)}
    cases = {"sgp": GossipConfig(sync=Sync.SGP), "osgp": GossipConfig(sync=Sync.OSGP),
             "dpsgd_ring": GossipConfig(sync=Sync.DPSGD),
             "dpsgd_exp": GossipConfig(sync=Sync.DPSGD, topology=Topology.EXPONENTIAL),
             "crossover": GossipConfig(sync=Sync.CROSSOVER, seed=5),
             "crossover_g2": GossipConfig(sync=Sync.CROSSOVER, groups=2, seed=5)}
    for name, cfg in cases.items():
        mixer = make_mixer(comm, cfg, BOUNDS)
        z, history = z0.clone(), []
        for step in range(12):
            z = mixer.mix(z, step)
            if name == "osgp":  # numerator and weight with the message of this step still in flight
                history.append((_gather((z * mixer.weight[:, None])[0], group), _gather(mixer.weight, group).reshape(-1)))
            else:
                history.append((_gather(z[0], group), _gather(mixer.weight, group).reshape(-1)))
        z = mixer.flush(z)
        res[name] = {"steps": history, "final": _gather(z[0], group), "weight": _gather(mixer.weight, group).reshape(-1)}
    perms = [derangement(n, seed=5, step=s, segment=k) for s in range(20) for k in range(3)]
    gathered = [None] * n
    dist.all_gather_object(gathered, perms, group=group)
    res["perms"] = gathered
    if ctx.rank == 0:
        torch.save(res, out)


def real_worker(ctx, out: str, cases: dict, steps: int, lr: float) -> None:
    """Least squares on real workers through GossipDataParallel; rank 0 saves every replica."""
    group = ctx.mesh.get_group()
    problem = LeastSquares.make(workers=ctx.world, dim=12, rows=16, pieces=4, seed=7)
    a, b = problem.a[ctx.rank], problem.b[ctx.rank]
    res = {}
    for name, (cfg, segments) in cases.items():
        model = PiecewiseLinear(problem.pieces, problem.initial())
        gdp = GossipDataParallel(model, sync=cfg.sync, group=group, segments=segments, groups=cfg.groups,
                                 topology=cfg.topology, seed=cfg.seed)
        opt = torch.optim.SGD(gdp.model.parameters(), lr=lr)
        for step in range(steps):
            local_loss(gdp, a, b).backward()
            gdp.step(opt, step)
            opt.zero_grad()
        gdp.flush()
        flat = torch.nn.utils.parameters_to_vector(gdp.model.parameters()).detach()
        res[name] = (_gather(flat, group), gdp.bytes_sent)
    if ctx.rank == 0:
        torch.save(res, out)
