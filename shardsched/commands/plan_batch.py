"""`plan --global-batch N` and `plan --max-batch`: the micro-batch as a planning lever
(the search itself is `solve.batch`)."""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys

from shardsched._fmt import fmt_bytes
from shardsched.core.types import Plan, Precision
from shardsched.cost.device import Cluster
from shardsched.commands.plan_profile import profile_or_refuse, sized_spec
from shardsched.solve.batch import max_micro_batch
from shardsched.solve.batch_choice import choose_batch

MAX_BATCH_STRATEGIES = ("replicate", "shard_grad_op", "full_shard", "auto")
"""The rows of `plan --max-batch`: each uniform strategy, then the auto planner."""


def _profile_at(args: argparse.Namespace, spec, cluster: Cluster, precision: Precision):
    """micro_batch -> profile, each size profiled once (analytic, traced or measured as `plan` does)."""

    @functools.lru_cache(maxsize=None)
    def at(m: int):
        return profile_or_refuse(sized_spec(spec, micro_batch=m, seq=args.seq), m, args.seq, args, cluster, precision).profile
    return at


def _make_kw(args: argparse.Namespace, precision: Precision) -> dict:
    return dict(precision=precision, optimizer=args.optimizer, fuse=not args.no_fuse,
                time_limit=args.time_limit or math.inf)


def global_batch_plan(args: argparse.Namespace, spec, cluster: Cluster, precision: Precision,
                      budget: int | None) -> tuple[Plan, object]:
    """`plan --global-batch`: `choose_batch` over this command's profiles; and the profile
    the plan was made from."""
    profile_at = _profile_at(args, spec, cluster, precision)
    plan = choose_batch(profile_at, cluster, global_batch=args.global_batch,
                        strategy=args.strategy or ("auto" if budget else "full_shard"), budget=budget,
                        micro_batch=args.micro_batch, grad_sync=args.grad_sync, **_make_kw(args, precision))
    return plan, profile_at(plan.micro_batch)


def print_max_batch(args: argparse.Namespace, spec, cluster: Cluster, precision: Precision,
                    budget: int | None) -> int:
    """One table: the largest micro-batch that fits under each strategy (no accumulation)."""
    budget = budget if budget is not None else cluster.device.memory_bytes
    profile_at = _profile_at(args, spec, cluster, precision)
    kw = {k: v for k, v in _make_kw(args, precision).items() if k != "time_limit" or v != math.inf}
    rows = []
    for strategy in MAX_BATCH_STRATEGIES:
        plan = max_micro_batch(profile_at, cluster, strategy=strategy, budget=budget, **kw)
        rows.append({"strategy": strategy, "max_micro_batch": plan.micro_batch if plan else 0,
                     "peak_bytes": plan.predicted.peak_bytes if plan else None,
                     "step_seconds": plan.predicted.step_seconds if plan else None})
    if args.json:
        sys.stdout.write(json.dumps({"memory_budget_bytes": budget, "seq": args.seq, "rows": rows}, indent=1) + "\n")
        return 0
    print(f"largest micro-batch per worker under {fmt_bytes(budget)} ({spec.name}, world {cluster.world}, "
          f"{cluster.device.name}, {precision.value}):")
    print(f"  {'strategy':<15}{'micro-batch':>12}{'peak':>14}{'step':>12}")
    for r in rows:
        fit = r["max_micro_batch"]
        peak = fmt_bytes(r["peak_bytes"]) if fit else "-"
        step = f"{r['step_seconds'] * 1e3:.1f} ms" if fit else "-"
        print(f"  {r['strategy']:<15}{fit if fit else 'none fits':>12}{peak:>14}{step:>12}")
    return 0
