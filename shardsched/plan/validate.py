"""A plan file, checked in full before anything runs or is written.

`read_plan_file` is the one reader of plan files a user hands us (`plan --plan`,
`train --plan`): bytes -> strict JSON (`_json.loads_strict`: UTF-8, no NaN or
Infinity, int64 range, bounded nesting) -> the schema (`Plan.from_json`) ->
`check_plan_consistency` (units, layers, prefetch lists and numbers make sense
on their own) -> `check_plan_layers` (the layers are this model's, in its
order). Every problem is a UsageError of one line naming the file.
"""
from __future__ import annotations

import math
from pathlib import Path

from shardsched.core.types import Plan
from shardsched.errors import UsageError

ACCEPTED = "accepted: the JSON `shardsched plan --json` writes"
MAX_PLAN_BYTES = 64 << 20
"""A plan of 100,000 units is about 30 MB; anything larger is not a plan."""


def read_plan_file(path: str) -> Plan:
    """A plan file, or a UsageError naming what is wrong with it."""
    if not path or not path.strip():
        raise UsageError(f"--plan is empty; {ACCEPTED}")
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"--plan {path} is a directory; {ACCEPTED}")
        if p.stat().st_size > MAX_PLAN_BYTES:
            raise UsageError(f"--plan {path} is larger than {MAX_PLAN_BYTES >> 20} MiB; {ACCEPTED}")
        raw = p.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read plan {path}: {e.strerror}") from None
    try:
        plan = Plan.from_json(raw)
        check_plan_consistency(plan)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{path}: malformed plan: {e}; {ACCEPTED}") from None
    return plan


def _dupes(names) -> list[str]:
    seen, dup = set(), []
    for n in names:
        if n in seen and n not in dup:
            dup.append(n)
        seen.add(n)
    return dup


def _check_numbers(plan: Plan) -> None:
    if plan.world < 1 or plan.gpus_per_node < 1:
        raise ValueError(f"world {plan.world} and gpus_per_node {plan.gpus_per_node} must be >= 1")
    if plan.micro_batch < 1:
        raise ValueError(f"micro_batch {plan.micro_batch} must be >= 1")
    if plan.seq < 0:
        raise ValueError(f"seq {plan.seq} must be >= 0")
    if plan.memory_budget_bytes is not None and plan.memory_budget_bytes <= 0:
        raise ValueError(f"memory_budget_bytes {plan.memory_budget_bytes} must be positive or null")
    if plan.usable_budget_bytes is not None and plan.usable_budget_bytes <= 0:
        raise ValueError(f"usable_budget_bytes {plan.usable_budget_bytes} must be positive or null")
    if plan.headroom_bytes < 0:
        raise ValueError(f"headroom_bytes {plan.headroom_bytes} must not be negative")
    pred = plan.predicted
    for name in ("peak_bytes", "step_seconds", "compute_seconds", "exposed_comm_seconds",
                 "lower_bound_seconds", "model_states_bytes", "comm_seconds"):
        value = getattr(pred, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"predicted.{name} {value} must be a finite number >= 0")


def check_plan_consistency(plan: Plan) -> None:
    """The plan on its own: ValueError naming the first inconsistency."""
    _check_numbers(plan)
    if not plan.units:
        raise ValueError("'units' is empty")
    for u in plan.units:
        root = u.layers == ("",)  # the root unit: `fully_shard(model)` (plan.units.ROOT)
        if not u.name.strip() and not root:
            raise ValueError("a unit has an empty name")
        if not u.layers or (not root and any(not layer.strip() for layer in u.layers)):
            raise ValueError(f"unit {u.name!r} has an empty 'layers' list or an empty layer name")
        if u.params < 0:
            raise ValueError(f"unit {u.name!r} has negative params {u.params}")
    for what, names in (("unit", [u.name for u in plan.units]),
                        ("layer", [layer for u in plan.units for layer in u.layers])):
        dup = _dupes(names)
        if dup:
            raise ValueError(f"{what} {dup[0]!r} is named twice")
    known = {u.name for u in plan.units}
    for u in plan.units:
        unknown = [n for n in (*u.forward_prefetch, *u.backward_prefetch) if n not in known]
        if unknown:
            raise ValueError(f"unit {u.name!r} prefetches {unknown[0]!r}, which is not a unit of the plan")


def check_plan_layers(plan: Plan, order: list[str], *, ordered: bool = True) -> None:
    """The plan's layers exist in `order` (the model's modules, in execution order)
    and, if `ordered`, appear in that order: UsageError otherwise. Registration order
    (`named_modules`) can differ from execution order (BERT's embeddings, tied heads),
    so callers holding only the module tree check existence alone."""
    index = {name: i for i, name in enumerate(order)}
    missing = [layer for u in plan.units for layer in u.layers if layer not in index]
    if missing:
        raise UsageError(f"plan names modules this model lacks: {', '.join(missing[:3])}")
    flat = [layer for u in plan.units for layer in u.layers]
    for a, b in zip(flat, flat[1:] if ordered else []):
        if index[b] <= index[a]:
            raise UsageError(f"plan lists layer {b!r} after {a!r}, out of the model's order; {ACCEPTED}")
