"""parallelize(model, plan, *, mesh): apply a Plan with FSDP2, in place.

Steps, in this fixed order (as torchtitan's parallelize_* functions):
1. check the plan belongs to this model and this world (and that the world is
   whole nodes when the plan uses node-aware strategies);
2. activation checkpointing (full, or selective: `core.sac_policy`) of every layer of a
   checkpointed unit, before
   `fully_shard` (torchtitan's order), with PyTorch's composable
   `torch.distributed._composable.checkpoint`: it works by forward hooks, so module
   paths and parameter names stay what the plan (and DCP checkpoints) name, where
   `checkpoint_wrapper` would insert `._checkpoint_wrapped_module` into every path.
   FSDP2 skips its own pre/post-forward hooks during the recomputation
   (`TrainingState.PRE_BACKWARD`), so parameters are not gathered twice;
3. `fully_shard` every unit, bottom-up (units are disjoint, the root last), with
   each strategy's mesh and `reshard_after_forward` (`unit_kwargs`): replicate
   units get a (world, 1) mesh (DDP on FSDP2's engine: HSDP with shard size 1),
   hybrid units a (nodes, gpus_per_node) mesh (HSDP), full_shard/node reshards to
   `gpus_per_node` after forward (FSDP2's int `reshard_after_forward`);
4. the schedule: each unit's forward/backward prefetch lists.

[Note: an empty backward prefetch list]
FSDP2 reads an empty `_states_to_backward_prefetch` as "use the implicit
default" (prefetch the previous unit, _fsdp_state.py `_pre_backward`). A plan
that prefetches nothing at a unit's backward must still be obeyed, so that unit
gets the list [itself]: `unshard` of an already-unsharded group is a no-op, and
the implicit default is off. What runs is what was solved.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from shardsched.errors import UsageError
from shardsched.core.types import Checkpoint, Plan, Precision, Strategy
from shardsched.plan.units import ROOT, tied_violation
from shardsched.plan.validate import check_plan_layers
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.layers import tied_sets
from shardsched.runtime.ddp import finds_unused, replicate_with_ddp, runs_on_ddp
from shardsched.runtime.gloo import settle_gloo_all_gathers
from shardsched.core.sac_policy import selective_contexts
from shardsched.runtime.own_backward import reshard_after_own_backward
from shardsched.runtime.scalars import average_scalar_grads, scalar_params


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


def replicate_mesh(mesh: DeviceMesh, shard: int = 1) -> DeviceMesh:
    """The (world/shard, shard) replicate-by-shard mesh over the same workers: shard
    1 is DDP, shard gpus_per_node is HSDP (consecutive ranks form a node, as
    torchrun and SLURM number them)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return DeviceMesh(mesh.device_type, mesh.mesh.reshape(-1, shard), mesh_dim_names=("replicate", "shard"))


def check_nodes(plan: Plan, world: int) -> None:
    """Node-aware strategies need whole nodes: one line otherwise."""
    if not any(u.strategy.multi_node for u in plan.units):
        return
    g = plan.gpus_per_node
    if g < 1 or world % g:
        raise UsageError(f"plan uses node-aware strategies with gpus_per_node {g}, which does not divide the "
                         f"world {world}; accepted: --gpus-per-node N with world a multiple of N")


def _mesh_2d(mesh: DeviceMesh, meshes: dict, shard: int) -> DeviceMesh:
    """Each 2-D mesh once: building one creates process groups (a collective call)."""
    if shard not in meshes:
        meshes[shard] = replicate_mesh(mesh, shard)
    return meshes[shard]


def _real_post_forward_mesh(strategy: Strategy):
    """[Note: the post-forward mesh of full_shard/node] `fully_shard(reshard_after_forward=k)`
    builds a DeviceMesh of k-rank groups (`_fsdp_init._get_post_forward_mesh_info`), whose
    ranks must be a real tensor: under the verifier's FakeTensorMode the mesh's view became
    fake and its `tolist()` a data-dependent error, so every full_shard/node plan went
    unverified. The call runs with fake mode unset, as `replicate_mesh` does for its mesh;
    the parameters are fake tensors already, so their shards stay fake. Outside a fake mode
    this changes nothing."""
    if strategy is not Strategy.FULL_SHARD_NODE:
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    return unset_fake_temporarily()


def unit_kwargs(strategy: Strategy, mesh: DeviceMesh, meshes: dict, gpus_per_node: int) -> dict:
    """`fully_shard`'s mesh and reshard_after_forward for one strategy."""
    if strategy is Strategy.REPLICATE:
        return dict(mesh=_mesh_2d(mesh, meshes, 1), reshard_after_forward=False)
    if strategy in (Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP):
        return dict(mesh=_mesh_2d(mesh, meshes, min(gpus_per_node, mesh.size())),
                    reshard_after_forward=strategy is Strategy.HYBRID_SHARD)
    if strategy is Strategy.FULL_SHARD_NODE:
        # FSDP2 reads an int equal to the shard size as True and 1 as False: both right here.
        return dict(mesh=mesh, reshard_after_forward=min(gpus_per_node, mesh.size()))
    return dict(mesh=mesh, reshard_after_forward=strategy is Strategy.FULL_SHARD)


# [Note: recomputation never changes module state]
# A checkpointed layer runs its forward twice per step: once in forward, once again in
# backward. Modules that update state in training forward would update it twice:
# BatchNorm's running statistics (after one step 0.0391 instead of 0.0206) and
# `num_batches_tracked`. PyTorch's checkpoint takes `context_fn` returning (forward
# context, recompute context) (torch/utils/checkpoint.py, non-reentrant only, which the
# composable `checkpoint` always is); the recompute context here gives every norm layer
# that tracks running statistics fresh copies of its statistics buffers and puts the
# originals back afterwards, so the recomputation updates the copies, which are dropped.
# Restoring values in place instead would bump the version counter of a buffer that the
# recomputed `batch_norm` saved for backward, which autograd then refuses. The copies are a
# few floats per channel.


@contextlib.contextmanager
def _running_stats_untouched(module: nn.Module):
    norms = [m for m in module.modules()
             if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training]
    originals = [(m, dict(m._buffers)) for m in norms]
    for m, buffers in originals:
        m._buffers.update({k: b.clone() for k, b in buffers.items() if b is not None})
    try:
        yield
    finally:
        for m, buffers in originals:
            m._buffers.update(buffers)


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _contexts(module: nn.Module, mode: Checkpoint):
    """checkpoint's `context_fn`: statistics kept during recomputation; selective: the
    policy's contexts too (`core.sac_policy`), the statistics context around its recompute one."""
    if mode.selective:
        def selective():
            forward, recompute = selective_contexts(mode)
            return forward, _both(_running_stats_untouched(module), recompute)
        return selective
    return lambda: (contextlib.nullcontext(), _running_stats_untouched(module))


def checkpoint_layers(model: nn.Module, plan: Plan) -> None:
    """Activation checkpointing on every layer of a checkpointed unit, each layer on its
    own ([Note: checkpointed units, layer by layer] in `plan.units`), full or selective
    (`core.types.Checkpoint`, [Note: the selective checkpointing policy] in `core.sac_policy`),
    before `fully_shard` (a checkpointed plan never runs on DDP: `runtime.ddp.runs_on_ddp`);
    recomputation leaves running statistics alone ([Note: recomputation never changes module
    state])."""
    for unit in plan.units:
        if unit.checkpoint:
            for name in unit.layers:
                module = model.get_submodule(name)
                checkpoint(module, context_fn=_contexts(module, unit.checkpoint))


def parallelize(model: nn.Module, plan: Plan, *, mesh: DeviceMesh, ddp: bool = True) -> nn.Module:
    """Shard `model` in place as `plan` says; returns it (an FSDPModule, or a
    DDP-replicated module when every unit is replicate and `ddp`: see runtime/ddp.py;
    ddp=False keeps such a plan on FSDP2, e.g. to measure FSDP2 itself)."""
    check_plan(model, plan, mesh.size())
    checkpoint_layers(model, plan)
    if ddp and runs_on_ddp(plan):  # DDP's engine for plain data parallelism: see runtime/ddp.py
        return replicate_with_ddp(model, mesh=mesh, find_unused_parameters=finds_unused(plan, model))
    check_nodes(plan, mesh.size())
    mp = mp_policy(plan.precision)
    meshes: dict[int, DeviceMesh] = {}  # shard size -> 2-D mesh, built once (each builds process groups)
    heads: dict[str, FSDPModule] = {}
    scalars = scalar_params(model)  # kept out of sharding: [Note: scalar parameters] in runtime.scalars
    root = next((u for u in plan.units if u.layers == (ROOT,)), None)
    units: list[list[nn.Module]] = []  # each non-root unit's modules, in forward order
    for unit in plan.units:
        if unit is root:
            continue  # `fully_shard(model)` below (plan/units.py, [Note: the root unit])
        modules = [model.get_submodule(name) for name in unit.layers]
        with _real_post_forward_mesh(unit.strategy):
            fully_shard(modules if len(modules) > 1 else modules[0], mp_policy=mp, ignored_params=scalars or None,
                        **unit_kwargs(unit.strategy, mesh, meshes, plan.gpus_per_node))
        heads[unit.name] = modules[0]  # grouped units share one state, reached via the first
        units.append(modules)
    # The root never reshards after forward (FSDP2 clears its post-forward mesh): its
    # strategy's mesh, reshard_after_forward=False (`plan.units.root_strategy`).
    kw = unit_kwargs(root.strategy, mesh, meshes, plan.gpus_per_node) if root is not None else dict(mesh=mesh)
    fully_shard(model, mp_policy=mp, ignored_params=scalars or None, **{**kw, "reshard_after_forward": False})
    reshard_after_own_backward(units)  # [Note: a unit whose inputs need no gradient]
    average_scalar_grads(scalars, mesh.get_group())
    settle_gloo_all_gathers(model, mesh.get_group())  # [Note: gloo's lagging buffers] in runtime/gloo.py
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
