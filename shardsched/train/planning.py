"""Where a run's plan comes from: --plan, or profiled and planned here.

Rank 0 loads or makes the plan and every worker receives the same one, so all
workers shard identically; the group's link is measured by all of them first.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from shardsched.errors import UsageError
from shardsched.core.types import Plan
from shardsched.train.config import TrainConfig
from shardsched.models.gpt import GPT


def share_from_rank0(make, *, mesh: DeviceMesh, rank: int):
    """Run make() on rank 0 and give its result to every worker; a UsageError on
    rank 0 is raised on every worker, so none waits for a broadcast that never comes."""
    obj = [None]
    if rank == 0:
        try:
            obj = [("ok", make())]
        except UsageError as e:
            obj = [("error", str(e))]
    dist.broadcast_object_list(obj, src=0, group=mesh.get_group())
    kind, value = obj[0]
    if kind == "error":
        raise UsageError(value)
    return value


def load_plan(path: str, *, model: torch.nn.Module, world: int) -> Plan:
    """Read --plan PATH and check that it belongs to this model and world."""
    from shardsched.plan.command import read_plan
    from shardsched.runtime.parallelize import check_plan
    plan = read_plan(path)
    check_plan(model, plan, world)
    return plan


def local_profile(cfg: TrainConfig, model: GPT, *, world: int):
    """One worker's micro-batch profiled on this machine: measured on CPU; on
    GPUs the analytic profile of the same config (the hooks time host-side
    launches, not kernels), which has the same layers and fingerprint."""
    from shardsched.cost.device import DEVICES
    from shardsched.core.types import Precision
    from shardsched.profile.analytic import analytic_profile
    from shardsched.profile.measure import measure_profile
    from shardsched.profile.resolve import compute_dtype
    from shardsched.train.config import model_config
    micro, dtype = cfg.batch // world, compute_dtype(Precision(cfg.precision))
    if _device_preset() != "cpu":
        return analytic_profile(model_config(cfg.model, seq=cfg.seq), micro_batch=micro, seq=cfg.seq,
                                device=DEVICES[_device_preset()], compute_dtype=dtype, name=cfg.model)
    idx = torch.zeros(micro, cfg.seq, dtype=torch.long)
    return measure_profile(copy.deepcopy(model), (idx, idx.clone()), name=cfg.model, compute_dtype=dtype)


def make_local_plan(cfg: TrainConfig, model: GPT, *, world: int, link=None, profile=None) -> Plan:
    """Plan this model for `world` workers of this machine (profiling it unless given).

    With neither --strategy nor --memory-budget (the embedded default) the plan
    is automatic under `solve.auto.default_budget`, so the run shows a mixed plan."""
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.solve.auto import default_budget
    from shardsched.solve.build import make_plan
    from shardsched.core.types import Optimizer, Precision
    precision = Precision(cfg.precision)
    profile = profile or local_profile(cfg, model, world=world)
    device = DEVICES[_device_preset()]
    if link is not None:  # this group's measured AllGather latency and bandwidth
        device = dataclasses.replace(device, intra=link, inter=link)
    cluster = Cluster(world=world, gpus_per_node=cfg.gpus_per_node or world, device=device)
    budget, notes = cfg.memory_budget_bytes, ()
    if cfg.strategy in (None, "auto") and budget is None:
        budget = default_budget(profile, cluster, precision=precision, optimizer=Optimizer.ADAM)
        notes = (f"default memory budget {budget} bytes: midway between the least-memory plan and "
                 f"shard_grad_op everywhere (give --memory-budget or --strategy to choose)",)
    plan = make_plan(profile, cluster, strategy=cfg.strategy or "auto",
                     precision=precision, optimizer="adam", memory_budget_bytes=budget)
    return dataclasses.replace(plan, notes=plan.notes + notes)


def _device_preset() -> str:
    """The DEVICES preset closest to this machine's accelerator ("cpu" without one)."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return next((k for k in ("h100", "a100", "v100") if k in name), "a100")


def obtain_plan(cfg: TrainConfig, model: GPT, *, mesh: DeviceMesh, rank: int) -> Plan:
    """Rank 0 loads or makes the plan; every worker gets the same one. A plan
    made here prices communication with this group's measured link
    (`profile.collectives.measure_link`, a collective: every rank takes part)."""
    from shardsched.profile.collectives import measure_link
    link = profile = None
    if not cfg.plan:
        link = measure_link(group=mesh.get_group(), device=torch.device(mesh.device_type))
        # Every worker profiles at once, so the times carry the contention of a real
        # step (workers sharing cores and memory bandwidth); rank 0's are used.
        profile = local_profile(cfg, model, world=mesh.size())

    def make() -> str:
        plan = (load_plan(cfg.plan, model=model, world=mesh.size()) if cfg.plan
                else make_local_plan(cfg, model, world=mesh.size(), link=link, profile=profile))
        return plan.to_json()
    return Plan.from_json(share_from_rank0(make, mesh=mesh, rank=rank))
