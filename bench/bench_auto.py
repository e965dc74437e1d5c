"""Auto plan vs every baseline over a sweep of memory budgets.

    python bench/bench_auto.py [--budgets 8] [--time-limit 10]

For each model config, budgets run from the least-memory plan's peak ("only
full_shard fits") to above the replicate baseline's peak ("replicate fits").
Columns: each baseline's step time relative to auto's (auto / baseline; "-"
when it does not fit); auto must be <= 1.000 against every fitting baseline.
"""
from __future__ import annotations

import argparse
import time

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.auto import auto_plan
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator, least_memory
from shardsched.plan.spec import parse_strategy_spec
from shardsched.core.types import Optimizer, Precision
from shardsched.profile.analytic import analytic_profile
from shardsched.models.spec import PRESETS

GiB = 1 << 30
CONFIGS = {  # name: (preset, world, gpus per node, device, micro batch, seq)
    "gpt2-xl/w8/a100": ("gpt2-xl", 8, 8, "a100", 4, 1024),
    "llama-7b/w64/a100": ("llama-7b", 64, 8, "a100", 1, 4096),
    # communication-bound: 4 nodes of 8 V100s on 100 Gb/s, short sequences
    "gpt2/w32/v100": ("gpt2", 32, 8, "v100", 2, 256),
}


def setup(key: str):
    preset, world, gpn, dev, mb, seq = CONFIGS[key]
    prof = analytic_profile(PRESETS[preset], micro_batch=mb, seq=seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


def budget_sweep(prof, cl, *, count: int) -> list[int]:
    kw = dict(pins={}, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
    lo = min(Evaluator(p).peak(least_memory(p)) for p in candidate_problems(prof, cl, **kw))
    hi = max(s.peak for s in uniform_baselines(prof, cl, **kw)) * 1.02
    return [int(lo * (hi / lo) ** (k / (count - 1))) for k in range(count)]


def row(prof, cl, budget: int, *, time_limit: float):
    """(auto seconds, {baseline: seconds or None}, auto plan)."""
    kw = dict(pins={}, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
    base = {s.name: (s.seconds if s.peak <= budget else None) for s in uniform_baselines(prof, cl, **kw)}
    plan = auto_plan(prof, cl, spec=parse_strategy_spec("auto"), precision=Precision.BF16_MIXED,
                     optimizer=Optimizer.ADAM, memory_budget_bytes=budget, time_limit=time_limit)
    return plan.predicted.step_seconds, base, plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args()
    for key in CONFIGS:
        prof, cl = setup(key)
        print(f"\n{key}  (auto / baseline step time; '-' = does not fit)")
        print(f"{'budget GiB':>10} {'auto s':>9} {'replicate':>10} {'shard_grad_op':>14} {'full_shard':>11}"
              f" {'auto/best':>10} {'solver':>22} {'plan s':>7}")
        for b in budget_sweep(prof, cl, count=args.budgets):
            t0 = time.perf_counter()
            t, base, plan = row(prof, cl, b, time_limit=args.time_limit)
            fit = [v for v in base.values() if v is not None]
            cells = [f"{t / base[k]:.3f}" if base[k] else "-" for k in ("replicate", "shard_grad_op", "full_shard")]
            best = f"{t / min(fit):.3f}" if fit else "-"
            solver = f"{plan.solver.name}/{plan.solver.status[:12]}"
            print(f"{b / GiB:10.2f} {t:9.4f} {cells[0]:>10} {cells[1]:>14} {cells[2]:>11} {best:>10} "
                  f"{solver:>22} {time.perf_counter() - t0:7.2f}")


if __name__ == "__main__":
    main()
