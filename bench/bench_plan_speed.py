"""Planning time of `--strategy auto` on big and small models (2-core machine target: < 10 s, < 1 s).

    python bench/bench_plan_speed.py
"""
from __future__ import annotations

import time

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.build import make_plan
from shardsched.profile.analytic import analytic_profile
from shardsched.models.spec import PRESETS

GiB = 1 << 30
CASES = [  # preset, world, gpus per node, device, micro batch, seq, budget GiB, limit s
    ("tiny", 8, 8, "cpu", 4, 128, 1, 1.0),
    ("small", 8, 8, "cpu", 4, 256, 2, 1.0),
    ("llama-7b", 64, 8, "a100", 1, 4096, 40, 10.0),
    # 32 nodes: the node-aware strategies and checkpointing enlarge the choice set (issue 10)
    ("llama-7b", 256, 8, "a100", 1, 4096, 40, 10.0),
    ("llama-7b", 256, 8, "a100", 1, 4096, 16, 10.0),
    # GPT-3 at seq 2048 keeps ~72 GiB of activations without recomputation: 80 GiB fits
    # only with checkpointing; seq 1024 fits without.
    ("gpt3-175b", 1024, 8, "h100", 1, 1024, 80, 10.0),
    # seq 2048 fits 80 GiB only by checkpointing
    ("gpt3-175b", 1024, 8, "h100", 1, 2048, 80, 10.0),
]


def main() -> None:
    print(f"{'model':>10} {'world':>6} {'budget':>7} {'units':>6} {'plan s':>7} {'limit':>6} {'solver':>8} "
          f"{'status':>20} {'gap':>9} {'step s':>8} {'peak GiB':>9}")
    for preset, world, gpn, dev, mb, seq, budget, limit in CASES:
        prof = analytic_profile(PRESETS[preset], micro_batch=mb, seq=seq, device=DEVICES[dev])
        cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])
        t0 = time.perf_counter()
        plan = make_plan(prof, cl, strategy="auto", precision="bf16-mixed", memory_budget_bytes=budget * GiB)
        dt = time.perf_counter() - t0
        s = plan.solver
        gap = "n/a" if s.gap is None else f"{s.gap:.2e}"
        print(f"{preset:>10} {world:>6} {budget:>6}G {len(plan.units):>6} {dt:7.2f} {limit:6.1f} {s.name:>8} "
              f"{s.status:>20} {gap:>9} {plan.predicted.step_seconds:8.4f} "
              f"{plan.predicted.peak_bytes / GiB:9.2f}{'' if dt < limit else '  SLOW'}  "
              f"{sum(u.checkpoint for u in plan.units)} ckpt, "
              f"{sorted({u.strategy.label for u in plan.units})}")


if __name__ == "__main__":
    main()
