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
REAL_CASES = {
    "allreduce": (GossipConfig(sync=Sync.ALLREDUCE), 1),
    "sgp": (GossipConfig(sync=Sync.SGP), 1),
    "osgp": (GossipConfig(sync=Sync.OSGP), 1),
    "dpsgd_ring": (GossipConfig(sync=Sync.DPSGD), 1),
    "dpsgd_exp": (GossipConfig(sync=Sync.DPSGD, topology=Topology.EXPONENTIAL), 1),
    "crossover": (GossipConfig(sync=Sync.CROSSOVER, seed=3), 3),
    "crossover_g2": (GossipConfig(sync=Sync.CROSSOVER, groups=2, seed=3), 3),
}
"""Every algorithm, run for REAL_STEPS steps of least squares on 4 real workers and in the simulator."""
REAL_STEPS, REAL_LR = 20, 0.5


def _gather(t: torch.Tensor, group) -> torch.Tensor:
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return torch.stack(out)


def _invariants(ctx) -> dict:
    """Mix random models by every rule on real workers; every replica before and after (on every rank)."""
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
    return res


def _real(ctx, cases: dict, steps: int, lr: float) -> dict:
    """Least squares on real workers through GossipDataParallel; every replica (on every rank)."""
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
    return res


def gossip_worker(ctx, out: str, real_cases: dict | None, steps: int = 0, lr: float = 0.0) -> None:
    """One launch for several test files (worker start-up is most of their time): the invariants,
    and with `real_cases` the real-vs-simulated runs; rank 0 saves {"invariants": .., "real": ..}."""
    res = {"invariants": _invariants(ctx)}
    if real_cases is not None:
        res["real"] = _real(ctx, real_cases, steps, lr)
    if ctx.rank == 0:
        torch.save(res, out)
