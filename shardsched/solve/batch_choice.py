"""The micro-batch as a planning lever, with the note that says what was chosen: the one path
of `plan --global-batch` (`commands.plan_batch`) and `train --global-batch` (`train.planning`)."""
from __future__ import annotations

import dataclasses

from shardsched.core.types import GradSync, Plan
from shardsched.cost.device import Cluster
from shardsched.solve.batch import plan_global_batch


def choose_batch(profile_at, cluster: Cluster, *, global_batch: int, strategy: str, budget: int | None,
                 micro_batch: int | None, grad_sync: str | None, **kw) -> Plan:
    """The fastest plan per global batch over the micro-batches and grad-sync modes that
    `micro_batch` / `grad_sync` leave open (`solve.batch.plan_global_batch`), with a first note
    saying what was chosen among what was tried. The one path of `plan --global-batch` and
    `train --global-batch` (`train.planning.make_local_plan`). kw: `make_plan`'s other arguments."""
    sync = GradSync(grad_sync) if grad_sync else None
    plan, tried = plan_global_batch(profile_at, cluster, global_batch=global_batch, strategy=strategy,
                                    budget=budget, micro_batch=micro_batch, grad_sync=sync, **kw)
    options = ", ".join(f"{c.micro_batch}x{c.accumulation} {c.grad_sync.value} "
                        + (f"{c.plan.predicted.step_seconds * 1e3:.1f} ms" if c.plan else "does not fit")
                        for c in tried)
    note = (f"global batch {global_batch}: micro-batch {plan.micro_batch} x {plan.accumulation} accumulated "
            f"per worker, gradients reduced {'after every micro-batch' if plan.grad_sync is GradSync.EVERY else 'after the last'}"
            f" (fastest per global batch of: {options})")
    return dataclasses.replace(plan, notes=(note, *plan.notes))
