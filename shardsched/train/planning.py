"""Where a run's plan comes from: --plan, or profiled and planned here.

The launching process (`plan_before_workers`), or under torchrun/SLURM rank 0
(`obtain_plan`), loads or makes the plan and every worker receives the same one,
so all workers shard identically.

[Note: deterministic plans. The same command must give the same plan on every
run (issue 7), so nothing the planner reads is a timing taken at start: links
and compute are priced from the device preset of this machine or from a
`--cluster` file (`shardsched profile --out`), GPT configs are profiled
analytically for that device, and models given as code (`python:`, `hf:`) are
traced on fake tensors (`profile.trace`): exact bytes and FLOPs, no timing.]
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from shardsched.cost.device import DeviceSpec
from shardsched.errors import UsageError
from shardsched.core.types import Plan, Precision
from shardsched.profile.types import Profile
from shardsched.train.config import TrainConfig
from shardsched.train.task import Built


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
    from shardsched.plan.validate import read_plan_file
    from shardsched.runtime.parallelize import check_plan
    plan = read_plan_file(path)
    check_plan(model, plan, world)
    return plan


def run_device(cfg: TrainConfig) -> DeviceSpec:
    """The device the planner prices this run on: `--cluster FILE`, else the preset
    closest to this machine. Never a measurement taken now."""
    from shardsched.cost.device import DEVICES, read_cluster_file
    from shardsched.profile.calibrate import machine_preset
    return read_cluster_file(cfg.cluster) if cfg.cluster else DEVICES[machine_preset()]


def local_profile(cfg: TrainConfig, built: Built, *, world: int, device: DeviceSpec) -> Profile:
    """The profile a run plans with, the one entry point. GPT configs: analytic for
    `device`; other models: traced on fake tensors (`profile.trace`) from one worker's
    example inputs: exact bytes and FLOPs, priced on `device`, the same on every run."""
    from shardsched.core.types import Precision
    from shardsched.models.spec import parse_model_spec
    from shardsched.profile.analytic import analytic_profile
    from shardsched.profile.resolve import compute_dtype
    from shardsched.profile.resolve import traced_or_measured
    dtype = compute_dtype(Precision(cfg.precision))
    config = parse_model_spec(cfg.model).config
    # [Note: a calibrated device prices traced FLOPs] The analytic profile prices every
    # FLOP at one MFU and leaves out elementwise work; a cluster file measured here
    # carries an efficiency per op class and a memory bandwidth, which only a traced
    # profile (FLOPs per class, bytes moved by memory-bound ops) can use.
    if cfg.layers is not None:  # --layers: the named boundaries, traced (analytic layers are fixed)
        from shardsched.profile.layers import SPEC_ATTR
        setattr(built.model, SPEC_ATTR, cfg.layers)
    elif config is not None and not cfg.cluster:
        from shardsched.train.config import model_config, worker_rows
        return analytic_profile(model_config(cfg.model, seq=cfg.seq), micro_batch=worker_rows(cfg, world=world),
                                seq=cfg.seq, device=device, compute_dtype=dtype, name=cfg.model)
    return traced_or_measured(built.model, built.example_inputs, name=cfg.model, device=device, dtype=dtype).profile


def make_local_plan(cfg: TrainConfig, built: Built, *, world: int, profile: Profile | None = None) -> Plan:
    """Plan this model for `world` workers of this machine (profiling it unless given).

    With neither --strategy nor --memory-budget (the embedded default) the plan
    is automatic under `solve.auto.default_budget`, so the run shows a mixed plan."""
    from shardsched.cost.device import Cluster
    from shardsched.solve.auto import default_budget
    from shardsched.solve.build import make_plan
    from shardsched.core.types import Optimizer, Precision
    precision = Precision(cfg.precision)
    device = run_device(cfg)
    profile = profile or local_profile(cfg, built, world=world, device=device)
    from shardsched.train.launcher import local_world_size
    cluster = Cluster(world=world, gpus_per_node=cfg.gpus_per_node or local_world_size(world), device=device)
    from shardsched.cost.headroom import Budget, headroom_for, stated, usable_budget
    budget = usable_budget(cfg.memory_budget_bytes, device_memory=device.memory_bytes,
                           headroom=headroom_for(cfg.headroom, device))
    notes = ()
    acc = local_accumulation(cfg, world=world)
    if cfg.strategy in (None, "auto") and cfg.memory_budget_bytes is None:
        # Computed from the model in usable bytes: no headroom comes off it.
        default = default_budget(profile, cluster, precision=precision, optimizer=Optimizer.ADAM, accumulation=acc)
        budget = Budget(given=default, headroom_bytes=0, usable=default)
        from shardsched._fmt import fmt_bytes
        notes = (f"default memory budget {fmt_bytes(default)}: midway between the least-memory plan and "
                 f"shard_grad_op everywhere (give --memory-budget or --strategy to choose)",)
    from shardsched.plan.spec import parse_strategy_spec
    strategy = cfg.strategy or "auto"
    planned = budget.usable if budget.given is not None or parse_strategy_spec(strategy).auto else None
    replan = None
    if chooses_batch(cfg):
        plan = stated(batch_plan(cfg, built, world=world, cluster=cluster, strategy=strategy, budget=planned,
                                 profile=profile), budget)
    else:
        def replan(b: int | None, *, selective: bool = True) -> Plan:  # [Note: a plan the engine cannot run]
            return stated(make_plan(profile if selective else profile.without_selective(), cluster, strategy=strategy, precision=precision,
                                    optimizer="adam", memory_budget_bytes=b, accumulation=acc), budget)
        plan, replan = replan(planned), (replan if parse_strategy_spec(strategy).auto else None)
    plan = verified(cfg, plan, built, profile, replan=replan, usable=planned)
    # What was set on the model for training (models.hf.training_defaults), said in the plan.
    return dataclasses.replace(plan, notes=plan.notes + notes + tuple(profile.extra.get("notes", ())))


def verified(cfg: TrainConfig, plan: Plan, built: Built, profile: Profile, *, replan, usable: int | None) -> Plan:
    """`plan` run once by the engine before any step (`shardsched.verify`; an auto plan is
    planned again until its verified peak fits, [Note: the closed loop]). A training worker
    holds a process group, so the engine runs in a fresh interpreter that rebuilds the model
    from `--model` (`verify.worker`)."""
    from shardsched.models.spec import parse_model_spec
    from shardsched.profile.resolve import build_model
    from shardsched.verify.loop import checked_plan
    from shardsched.verify.subject import Subject
    recipe = {"model": cfg.model, "layers": cfg.layers, "position_table": cfg.seq}

    def build(*, micro_batch: int, seq: int | None, real: bool):
        return build_model(parse_model_spec(cfg.model), micro_batch=micro_batch, seq=seq, measure=real,
                           layers=cfg.layers, position_table=cfg.seq)
    subject = Subject(built.model, built.example_inputs, build, recipe=recipe)
    return checked_plan(plan, subject=subject, replan=replan, usable=usable,
                        analytic=profile.source == "analytic", enabled=cfg.verify)


def chooses_batch(cfg: TrainConfig) -> bool:
    """`train --global-batch` on a model whose rows are the global batch: the planner chooses
    what `--micro-batch` and `--grad-sync` leave open, as `plan --global-batch` does."""
    from shardsched.train.config import user_sized
    return cfg.choose_batch and not user_sized(cfg.model)


def batch_plan(cfg: TrainConfig, built: Built, *, world: int, cluster, strategy: str, budget: int | None,
               profile: Profile) -> Plan:
    """`solve.batch_choice.choose_batch` (the path of `plan --global-batch`) over this run's profiles:
    at each micro-batch m, `local_profile` of the first m rows of one worker's example inputs,
    the micro-batch training runs (`runtime.accum.split_micro_batches`); `profile` is the one at
    the rows the flags give."""
    from shardsched.solve.batch_choice import choose_batch
    from shardsched.runtime.accum import split_micro_batches
    from shardsched.train.config import worker_rows
    rows = worker_rows(cfg, world=world)
    profiles = {rows: profile}

    def profile_at(m: int) -> Profile:
        if m not in profiles:
            inputs = split_micro_batches(built.example_inputs, rows // m)[0]
            sized = dataclasses.replace(cfg, micro_batch=m)
            profiles[m] = local_profile(sized, built._replace(example_inputs=inputs), world=world,
                                        device=cluster.device)
        return profiles[m]
    return choose_batch(profile_at, cluster, global_batch=cfg.batch, strategy=strategy, budget=budget,
                        micro_batch=cfg.micro_batch, grad_sync=cfg.grad_sync, precision=Precision(cfg.precision),
                        optimizer="adam")


def local_accumulation(cfg: TrainConfig, *, world: int):
    """(K, GradSync) of this run's `--micro-batch` / `--grad-sync` for the planner to price
    (`solve.batch`: memory of the accumulated gradients, K passes per step); None without
    accumulation (a `python:` model sizes its own inputs)."""
    from shardsched.runtime.accum import resolve
    from shardsched.train.config import user_sized
    if user_sized(cfg.model):
        return None
    acc = resolve(batch=cfg.batch, world=world, micro_batch=cfg.micro_batch, grad_sync=cfg.grad_sync)
    return (acc.steps, acc.grad_sync) if acc.steps > 1 else None


def plan_before_workers(checked, *, world: int) -> Plan:
    """The run's plan (`checked`: what `train.validate.validate` returned: its --plan, else one
    made here), in the launching process before it spawns the workers.

    [Note: planned before the workers start]
    A run whose workers this process spawns plans here, where no process group exists
    yet: the engine verifies the plan in this process (`verify.subject.verifier`), with
    the model `validate` already built, and every worker receives the plan as an
    argument. Planned on rank 0 instead, the verification needs a fresh interpreter
    (a worker holds a process group, [Note: the fake world is this process's own]) that
    imports torch and rebuilds the model again (measured ~5 CPU s per run on 2 cores),
    and a budget nothing fits is found after the workers started. Under torchrun or SLURM
    every process is a worker, so rank 0 plans (`obtain_plan`)."""
    return checked.plan if checked.plan is not None else make_local_plan(checked.cfg, checked.built, world=world)


def obtain_plan(cfg: TrainConfig, built: Built, *, mesh: DeviceMesh, rank: int) -> Plan:
    """Rank 0 loads or makes the plan; every worker gets the same one."""
    def make() -> str:
        plan = (load_plan(cfg.plan, model=built.model, world=mesh.size()) if cfg.plan
                else make_local_plan(cfg, built, world=mesh.size()))
        return plan.to_json()
    return Plan.from_json(share_from_rank0(make, mesh=mesh, rank=rank))
