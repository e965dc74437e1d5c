"""Planning time and quality of `--strategy auto` (2-core machine target: < 10 s per big case).

Per case: seconds, status, the gap to the bound over the whole search space, and the
ratio of the plan's step time to the plan of a 10x longer search (10x the work limit:
`solve.search.Effort(scale=10)`, 10x the nodes and MILPs on 10x larger groupings).

    python bench/bench_plan_speed.py                 # every case, with the 10x runs (minutes)
    python bench/bench_plan_speed.py --no-10x        # the planning times only
    python bench/bench_plan_speed.py --only llama-7b
"""
from __future__ import annotations

import argparse
import time

from shardsched.core.types import Optimizer, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import PRESETS
from shardsched.plan.spec import parse_strategy_spec
from shardsched.profile.analytic import analytic_profile
from shardsched.solve.auto import auto_plan
from shardsched.solve.search import Effort

GiB = 1 << 30
CASES = [  # preset, world, gpus per node, device, micro batch, seq, budget GiB, limit s
    ("tiny", 8, 8, "cpu", 4, 128, 1, 1.0),
    ("small", 8, 8, "cpu", 4, 256, 2, 1.0),
    ("llama-7b", 64, 8, "a100", 1, 4096, 40, 10.0),
    # 32 nodes: the node-aware strategies and checkpointing enlarge the choice set (issue 10)
    ("llama-7b", 256, 8, "a100", 1, 4096, 40, 10.0),
    ("llama-7b", 256, 8, "a100", 1, 4096, 16, 10.0),
    ("llama-70b", 512, 8, "a100", 1, 4096, 40, 10.0),
    # GPT-3 at seq 2048 fits 80 GiB only by checkpointing
    ("gpt3-175b", 1024, 8, "h100", 1, 2048, 80, 10.0),
]


def plan(case, effort: Effort):
    preset, world, gpn, dev, mb, seq, budget, _ = case
    prof = analytic_profile(PRESETS[preset], micro_batch=mb, seq=seq, device=DEVICES[dev])
    cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])
    t0 = time.perf_counter()
    p = auto_plan(prof, cl, spec=parse_strategy_spec("auto"), precision=Precision.BF16_MIXED,
                  optimizer=Optimizer.ADAM, memory_budget_bytes=budget * GiB, effort=effort)
    return p, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-10x", action="store_true", help="skip the 10x longer searches")
    ap.add_argument("--only", default=None, help="cases of this preset only")
    args = ap.parse_args()
    print(f"{'model':>10} {'world':>6} {'budget':>7} {'units':>6} {'plan s':>7} {'solver':>7} {'step s':>9} "
          f"{'bound s':>9} {'gap':>8} {'10x s':>7} {'10x gap':>8} {'ratio':>7}  status")
    for case in CASES:
        if args.only and case[0] != args.only:
            continue
        p, dt = plan(case, Effort())
        s = p.solver
        row = (f"{case[0]:>10} {case[1]:>6} {case[6]:>6}G {len(p.units):>6} {dt:7.2f} {s.name:>7} "
               f"{p.predicted.step_seconds:9.4f} {s.bound:9.4f} {s.gap:8.3%}")
        if args.no_10x:
            print(f"{row} {'':>7} {'':>8} {'':>7}  {s.status}{'  SLOW' if dt > case[7] else ''}", flush=True)
            continue
        long, dt10 = plan(case, Effort(scale=10))
        ratio = p.predicted.step_seconds / long.predicted.step_seconds
        print(f"{row} {dt10:7.1f} {long.solver.gap:8.3%} {ratio:7.4f}  {s.status}"
              f"{'  SLOW' if dt > case[7] else ''}", flush=True)


if __name__ == "__main__":
    main()
