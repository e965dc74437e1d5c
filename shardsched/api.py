"""The two library calls that have no home elsewhere: plan a model you hold, read a plan file.

Everything else the public surface (`shardsched/__init__.py`) names lives where it
is implemented; these compose those pieces the way `shardsched plan` does.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch.nn as nn

    from shardsched.core.types import Plan


def plan_model(model: "nn.Module", example_inputs: Sequence[Any], *, world: int, gpus_per_node: int | None = None,
               device: str = "cpu", memory_budget: int | str | None = None, strategy: str | None = None,
               precision: str = "fp32", name: str | None = None, time_limit: float = 10.0,
               headroom: str | None = None, verify: bool = True) -> "Plan":
    """A plan for `model` on `world` workers of `device` (a preset name, `DEVICES`).

    `model(*example_inputs)` is one worker's loss; it is traced on fake tensors (exact
    bytes and FLOPs, nothing allocated, the same plan every call). `strategy` defaults to
    "auto" with a `memory_budget` (bytes or "40GiB") and "full_shard" without. Call it
    on one rank and broadcast the plan (or on every rank: it is deterministic). `headroom`
    ("5%+1GiB", as `--headroom`; default the device's) is taken off the budget first.
    `verify`: run the plan once under FSDP2 on fake tensors first (`shardsched.verify`; an
    auto plan is planned again until its verified peak fits). Call it before
    `init_process_group`: verification makes the fake process group its own for the run."""
    from shardsched.cost.bytes import parse_bytes
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.cost.headroom import headroom_for, stated, usable_budget
    from shardsched.plan.spec import parse_strategy_spec
    from shardsched.errors import UsageError
    from shardsched.profile.resolve import compute_dtype
    from shardsched.core.types import Precision
    from shardsched.profile.resolve import traced_or_measured
    from shardsched.solve.build import make_plan
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; accepted: {', '.join(DEVICES)}")
    budget = parse_bytes(memory_budget) if isinstance(memory_budget, str) else memory_budget
    dtype = compute_dtype(Precision(precision))
    profile = traced_or_measured(model, tuple(example_inputs), name=name or type(model).__name__,
                                 device=DEVICES[device], dtype=dtype).profile
    cluster = Cluster(world=world, gpus_per_node=gpus_per_node or min(8, world), device=DEVICES[device])
    usable = usable_budget(budget, device_memory=cluster.device.memory_bytes,
                           headroom=headroom_for(headroom, cluster.device))
    strategy = strategy or ("auto" if budget else "full_shard")
    auto = parse_strategy_spec(strategy).auto
    planned = usable.usable if budget or auto else None  # as `plan` does

    def replan(b: int | None, *, selective: bool = True) -> "Plan":  # [Note: a plan the engine cannot run]
        plan = stated(make_plan(profile if selective else profile.without_selective(), cluster, strategy=strategy, precision=precision,
                                memory_budget_bytes=b, time_limit=time_limit), usable)
        return dataclasses.replace(plan, notes=plan.notes + tuple(profile.extra.get("notes", ())))
    from shardsched.verify.loop import checked_plan
    from shardsched.verify.subject import Subject

    def build(**_):  # the caller's model at its own shapes is the one verified
        return model, tuple(example_inputs)
    return checked_plan(replan(planned), subject=Subject(model, tuple(example_inputs), build),
                        replan=replan if auto else None, usable=planned, analytic=False, enabled=verify)


def load_plan(path: str) -> "Plan":
    """The plan in a JSON file (`shardsched plan --out`, a run's plan.json); a UsageError
    naming what is wrong otherwise. `parallelize` checks it belongs to your model."""
    from shardsched.plan.validate import read_plan_file
    return read_plan_file(path)
