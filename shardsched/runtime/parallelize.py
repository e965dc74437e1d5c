"""parallelize(model, plan, *, mesh): apply a Plan with FSDP2, in place.

Steps, in this fixed order (as torchtitan's parallelize_* functions):
1. check the plan belongs to this model and this world;
2. `fully_shard` every unit, bottom-up (units are disjoint, the root last), with
   `reshard_after_forward=True` for full_shard and False otherwise; replicate
   units get a (world, 1) mesh: FSDP2 then shards over a group of one and
   all-reduces gradients over the world, which is DDP on FSDP2's engine (HSDP
   with shard size 1);
3. the schedule: each unit's forward/backward prefetch lists.

[Note: an empty backward prefetch list]
FSDP2 reads an empty `_states_to_backward_prefetch` as "use the implicit
default" (prefetch the previous unit, _fsdp_state.py `_pre_backward`). A plan
that prefetches nothing at a unit's backward must still be obeyed, so that unit
gets the list [itself]: `unshard` of an already-unsharded group is a no-op, and
the implicit default is off. What runs is what was solved.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from shardsched.errors import UsageError
from shardsched.core.types import Plan, Precision, Strategy
from shardsched.plan.units import ROOT, tied_violation
from shardsched.plan.validate import check_plan_layers
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.layers import tied_sets
from shardsched.runtime.ddp import replicate_with_ddp, runs_on_ddp


def mp_policy(precision: Precision) -> MixedPrecisionPolicy:
    if precision is Precision.BF16_MIXED:
        # bf16 gathers and compute; fp32 reductions and master weights.
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def check_plan(model: nn.Module, plan: Plan, world: int) -> None:
    fp = fingerprint(model)
    if fp != plan.fingerprint:
        raise UsageError(f"plan was made for another model (fingerprint {plan.fingerprint}, "
                         f"this model {fp}); make a plan for this model with 'shardsched plan'")
    if plan.world != world:
        raise UsageError(f"plan was made for {plan.world} workers, this run has {world}; "
                         f"re-plan with --world {world}")
    check_plan_layers(plan, [n for n, _ in model.named_modules()], ordered=False)
    bad = tied_violation([u.layers for u in plan.units], tied_sets(model))
    if bad:
        raise UsageError(bad)


def replicate_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The (world, 1) replicate-by-shard mesh over the same workers."""
    return DeviceMesh(mesh.device_type, mesh.mesh.reshape(-1, 1), mesh_dim_names=("replicate", "shard"))


def parallelize(model: nn.Module, plan: Plan, *, mesh: DeviceMesh, ddp: bool = True) -> nn.Module:
    """Shard `model` in place as `plan` says; returns it (an FSDPModule, or a
    DDP-replicated module when every unit is replicate and `ddp`: see runtime/ddp.py;
    ddp=False keeps such a plan on FSDP2, e.g. to measure FSDP2 itself)."""
    check_plan(model, plan, mesh.size())
    if ddp and runs_on_ddp(plan):  # DDP's engine for plain data parallelism: see runtime/ddp.py
        return replicate_with_ddp(model, mesh=mesh)
    mp = mp_policy(plan.precision)
    rep_mesh = replicate_mesh(mesh) if any(u.strategy is Strategy.REPLICATE for u in plan.units) else None
    heads: dict[str, FSDPModule] = {}
    root = next((u for u in plan.units if u.layers == (ROOT,)), None)
    for unit in plan.units:
        if unit is root:
            continue  # `fully_shard(model)` below (plan/units.py, [Note: the root unit])
        modules = [model.get_submodule(name) for name in unit.layers]
        fully_shard(modules if len(modules) > 1 else modules[0],
                    mesh=rep_mesh if unit.strategy is Strategy.REPLICATE else mesh,
                    reshard_after_forward=unit.strategy is Strategy.FULL_SHARD, mp_policy=mp)
        heads[unit.name] = modules[0]  # grouped units share one state, reached via the first
    fully_shard(model, mesh=rep_mesh if root and root.strategy is Strategy.REPLICATE else mesh,
                reshard_after_forward=False, mp_policy=mp)
    if root is not None:
        heads[root.name] = model
    apply_schedule(plan, heads)
    return model


def apply_schedule(plan: Plan, heads: dict[str, FSDPModule]) -> None:
    for unit in plan.units:
        me = heads[unit.name]
        me.set_modules_to_forward_prefetch([heads[n] for n in unit.forward_prefetch])
        # See [Note: an empty backward prefetch list].
        me.set_modules_to_backward_prefetch([heads[n] for n in unit.backward_prefetch] or [me])
