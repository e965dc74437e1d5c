"""Predicted against measured peak on generated models and plans (issue 15).

Draws N (model, plan) cases from the property-based generator of the tests
(tests/plan/_generated.py: causal LMs with vocabularies 256..64k, tied or not, the loss in
the root or a child, nn.Sequential or custom MLPs, repeated blocks, wrappers; BatchNorm /
GroupNorm CNNs; MLP-Mixers; every strategy, checkpointing, fused units, auto at random
budgets), runs each plan under FSDP2 on a fake process group with FSDPMemTracker, and prints
the error distribution (predicted / measured - 1) by strategy and family, the worst cases,
and how many auto plans exceeded their budget.

    .venv/bin/python bench/bench_generated_memory.py --cases 500 [--seed 0] [--csv out.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import warnings  # noqa: E402

from tests.plan._generated import draw_case, measure  # noqa: E402

warnings.filterwarnings("ignore", message="FSDP2-wrapped module")


def collect(n: int, first: int) -> list[dict]:
    """Cases drawn from seeds first .. first + n - 1 (the test draws its seeds through hypothesis)."""
    cases: list[dict] = []
    for k in range(first, first + n):
        s, ps = draw_case(k)
        try:
            cases.append(measure(s, ps))
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a finding too
            cases.append({"spec": s, "plan": ps, "failed": f"{type(e).__name__}: {str(e)[:160]}"})
        c = cases[-1]
        print(f"{k:4d} {'unet' if s.skip else s.family:5s} {ps.strategy + ('/' + ps.other if ps.other else ''):30s} w={ps.world:3d} "
              + (f"err={c['error']:+7.1%}" if "error" in c else c["failed"]), flush=True)
    return cases


def _checkpointing(ps) -> str:
    """"sac" when a word of the plan is `+sac` (selective), "ckpt" for `+ckpt` only, else
    "none" (auto plans: "auto", whose checkpointing the planner chooses)."""
    words = f"{ps.strategy},{ps.other}"
    return "auto" if ps.strategy == "auto" else "sac" if "+sac" in words else "ckpt" if "+ckpt" in words else "none"


def summarise(cases: list[dict]) -> None:
    ok = [c for c in cases if "error" in c]
    print(f"\n{len(cases)} cases, {len(cases) - len(ok)} failed to run")
    groups: dict[str, list[float]] = {}
    for c in ok:
        word = "mixed" if c["plan"].other else c["plan"].strategy
        groups.setdefault(f"strategy {word}", []).append(c["error"])
        groups.setdefault(f"family {'unet' if c['spec'].skip else c['spec'].family}", []).append(c["error"])
        groups.setdefault(f"checkpointing {_checkpointing(c['plan'])}", []).append(c["error"])
        ps = c["plan"]
        groups.setdefault("accumulation " + (f"{ps.accumulation} {ps.grad_sync}" if ps.accumulation > 1 else "none"),
                          []).append(c["error"])
    groups["all"] = [c["error"] for c in ok]
    print(f"{'group':28s} {'n':>4s} {'median':>8s} {'min':>8s} {'max':>8s} {'within 3%':>9s}")
    for k, v in sorted(groups.items()):
        inside = sum(abs(e) <= 0.03 for e in v) / len(v)
        print(f"{k:28s} {len(v):4d} {statistics.median(v):+8.1%} {min(v):+8.1%} {max(v):+8.1%} {inside:9.0%}")
    over = [c for c in ok if c["budget"] is not None and c["measured"] > c["budget"]]
    autos = sum(c["budget"] is not None for c in ok)
    print(f"auto plans over their budget when run: {len(over)} of {autos}")
    print("worst 10 by |error|:")
    for c in sorted(ok, key=lambda c: -abs(c["error"]))[:10]:
        print(f"  {c['error']:+7.1%} {c['plan']} {c['spec']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="the first case's seed")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = collect(args.cases, args.seed)
    summarise(cases)
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["family", "spec", "plan", "predicted", "measured", "budget", "error", "failed"])
            for c in cases:
                w.writerow([c["spec"].family, c["spec"], c["plan"], c.get("predicted"), c.get("measured"),
                            c.get("budget"), c.get("error"), c.get("failed", "")])


if __name__ == "__main__":
    main()
