"""Predicted vs measured, per strategy, with a calibrated cluster file; measured twice.

    .venv/bin/python bench/bench_predict.py [--cluster cluster.json] [--nproc 2] [--steps 30]

1. `shardsched profile --nproc N --out OUT/cluster.json` (unless --cluster names one);
2. `shardsched bench --nproc N --cluster ... --json` twice, into OUT/run1 and OUT/run2;
3. prints, for every strategy and run, the predicted and measured median step time and
   peak memory with their errors, and whether any plan (units, strategies, schedule)
   or prediction changed between the two runs.

Acceptance (issue 7): every step-time error within 25%, and no change between runs.
Exit status 0 when both hold, 1 otherwise (the numbers are printed either way).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TOLERANCE = 0.25


def shardsched(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "shardsched", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"shardsched {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def plans(run_dir: Path) -> dict[str, dict]:
    """Each variant's plan.json without the solver's seconds (the only field allowed to vary)."""
    out = {}
    for path in sorted(run_dir.glob("*/plan.json")):
        plan = json.loads(path.read_text())
        plan.get("solver", {}).pop("seconds", None)
        out[path.parent.name] = plan
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default=None, help="cluster file to use (default: calibrate now)")
    ap.add_argument("--nproc", default="2")
    ap.add_argument("--steps", default="30")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", default=None, help="directory for the cluster file and runs (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-predict-"))
    out.mkdir(parents=True, exist_ok=True)
    cluster = args.cluster or str(out / "cluster.json")
    if not args.cluster:
        shardsched("profile", "--nproc", args.nproc, "--out", cluster)
    print(f"cluster file: {cluster}")
    runs = []
    for k in (1, 2):
        rows = json.loads(shardsched("bench", "--nproc", args.nproc, "--steps", args.steps, "--model", args.model,
                                     "--cluster", cluster, "--json", "--run-dir", str(out / f"run{k}")))
        runs.append(rows)
    print(f"{'run':>3} {'variant':<14} {'measured':>10} {'predicted':>10} {'error':>7}   "
          f"{'peak meas.':>11} {'peak pred.':>11} {'error':>7}")
    worst = 0.0
    for k, rows in enumerate(runs, 1):
        for r in rows:
            worst = max(worst, abs(r["step_error"]))
            print(f"{k:>3} {r['variant']:<14} {r['step_seconds'] * 1e3:>8.1f}ms {r['predicted_step_seconds'] * 1e3:>8.1f}ms "
                  f"{r['step_error']:>+7.0%}   {r['peak_bytes'] / 2**20:>8.2f}MiB {r['predicted_peak_bytes'] / 2**20:>8.2f}MiB "
                  f"{r['peak_error']:>+7.0%}")
    first, second = plans(out / "run1"), plans(out / "run2")
    changed = sorted(v for v in set(first) | set(second) if first.get(v) != second.get(v))
    print(f"worst step-time error: {worst:.0%} (acceptance: within {TOLERANCE:.0%})")
    print(f"plans and predictions changed between the two runs: {', '.join(changed) if changed else 'none'}")
    return 0 if worst <= TOLERANCE and not changed else 1


if __name__ == "__main__":
    sys.exit(main())
