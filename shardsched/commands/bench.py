"""`shardsched bench`: the same model, steps and workers under each uniform
strategy and a plan (--plan, or else the automatic plan under the default
budget, as `shardsched train` makes it), in one invocation, with ratios vs
full_shard.

All variants run one after another inside the same worker processes, so
they share start-up, cores and data; only the sharding differs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from shardsched._flags import add_layers_argument
from shardsched.core.types import Plan
from shardsched.train.args import config_from_args, model_choices, world_size
from shardsched.train.validate import validate
from shardsched.train.config import TrainConfig

STRATEGIES = ("replicate", "shard_grad_op", "full_shard")
DEFAULT_BENCH_STEPS = 30


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--nproc", type=int, default=None, help="local workers to spawn (default 2; under torchrun/SLURM: must match)")
    a("--steps", type=int, default=DEFAULT_BENCH_STEPS, help=f"steps per variant (default {DEFAULT_BENCH_STEPS})")
    a("--seed", type=int, default=0)
    a("--model", default="tiny", help=f"model spec: {model_choices()} (default tiny)")
    add_layers_argument(parser)
    a("--data", default=None, help="text file (default: the Python standard library sources)")
    a("--plan", default=None, help="also run this plan.json (default: the automatic plan under the default budget)")
    a("--batch", type=int, default=8, help="global batch in sequences (default 8)")
    a("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    a("--run-dir", default=None, help="output directory (default runs/bench-<timestamp>)")
    a("--cluster", default=None, help="cluster file from `shardsched profile --out` pricing the plans' predictions "
                                      "(default: this machine's device preset)")
    a("--json", action="store_true", help="print the results as JSON instead of a table")


def bench_configs(args: argparse.Namespace, run_dir: str) -> list[tuple[str, TrainConfig]]:
    """One (label, config) per variant; each variant writes its own sub-directory."""
    ns = argparse.Namespace(**{**vars(args), "strategy": None, "plan": None, "memory_budget": None,
                               "checkpoint_every": 0, "resume": None, "lr": None, "eval_every": 0,
                               "quiet": True, "run_dir": run_dir})
    base = config_from_args(ns)
    variants = [(s, dataclasses.replace(base, strategy=s, run_dir=f"{run_dir}/{s}")) for s in STRATEGIES]
    if args.plan:
        variants.append(("plan", dataclasses.replace(base, plan=args.plan, run_dir=f"{run_dir}/plan")))
    else:  # strategy None, no budget: auto under solve.auto.default_budget
        variants.append(("auto", dataclasses.replace(base, run_dir=f"{run_dir}/auto")))
    return variants


def _bench_worker(ctx, variants: list[tuple[str, TrainConfig, Plan | None]], out: str) -> None:
    from shardsched.train.trainer import train
    results = {}
    for label, cfg, plan in variants:
        results[label] = train(cfg, mesh=ctx.mesh, rank=ctx.rank, device=ctx.device, plan=plan).summary
    if ctx.rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))


def _planned(cfg: TrainConfig, *, world: int, local: bool) -> tuple[TrainConfig, Plan | None]:
    """The variant checked, and planned here when this process spawns the workers
    ([Note: planned before the workers start])."""
    from shardsched.train.planning import plan_before_workers
    checked = validate(cfg, world=world)
    plan = plan_before_workers(checked, world=world) if local else None
    return checked.cfg, plan


def run_bench(args: argparse.Namespace) -> int:
    from shardsched.train.launcher import WorkerFailed, external_rendezvous, launch
    world = world_size(args.nproc)
    run_dir = args.run_dir or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}"
    variants = [(label, *_planned(cfg, world=world, local=external_rendezvous() is None))
                for label, cfg in bench_configs(args, run_dir)]
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    out = str(Path(run_dir) / "bench.json")
    try:
        launch(_bench_worker, nproc=world, args=(variants, out))
    except WorkerFailed as e:
        print(f"shardsched bench: {e}", file=sys.stderr)
        return 1
    results = json.loads(Path(out).read_text())
    if args.json:
        print(json.dumps(bench_rows(results), indent=1))
    else:
        print_bench(results, world=world, steps=args.steps, model=args.model)
    print(f"bench: wrote {out} and one run directory per variant under {run_dir}", file=sys.stderr if args.json else sys.stdout)
    return 0


def error(predicted, measured) -> float | None:
    """(predicted - measured) / measured: positive when the plan over-predicts."""
    return (predicted - measured) / measured if predicted is not None and measured else None


def bench_rows(results: dict) -> list[dict]:
    """Per variant: median step time, tokens/s, measured peak, ratios vs full_shard,
    and the plan's predictions with their relative errors."""
    ref = results.get("full_shard", {})
    rows = []
    for label, s in results.items():
        step, peak = s["measured_step_seconds"], s["measured_peak_bytes"]
        rows.append({"variant": label, "step_seconds": step, "tokens_per_s": s["tokens_per_s"],
                     "peak_bytes": peak, "predicted_step_seconds": s["predicted_step_seconds"],
                     "predicted_peak_bytes": s["predicted_peak_bytes"],
                     "step_ratio": _ratio(step, ref.get("measured_step_seconds")),
                     "peak_ratio": _ratio(peak, ref.get("measured_peak_bytes")),
                     "step_error": error(s["predicted_step_seconds"], step),
                     "peak_error": error(s["predicted_peak_bytes"], peak),
                     "last_loss": s["last_loss"]})
    return rows


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def print_bench(results: dict, *, world: int, steps: int, model: str) -> None:
    """80 columns: tokens/s and the rest are in bench.json (and bench --json)."""
    from rich import box
    from rich.table import Table

    from shardsched._fmt import console, fmt_bytes_short as fmt_bytes
    table = Table(title=f"shardsched bench: {model}, {world} workers, {steps} steps per variant",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("variant", "step", "pred.", "err", "peak", "pred.", "err", "vs fs"):
        table.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    fmt = lambda r: "n/a" if r is None else f"{r:.2f}x"  # noqa: E731
    pct = lambda e: "n/a" if e is None else f"{e:+.0%}"  # noqa: E731
    for r in bench_rows(results):
        table.add_row(r["variant"], f"{r['step_seconds'] * 1e3:.1f} ms", f"{r['predicted_step_seconds'] * 1e3:.1f} ms",
                      pct(r["step_error"]), fmt_bytes(r["peak_bytes"]), fmt_bytes(r["predicted_peak_bytes"]),
                      pct(r["peak_error"]), fmt(r["step_ratio"]))
    out = console()
    out.print(table)
    out.print("step: median measured step; peak: per worker; pred.: the plan's prediction, err its error; "
              "vs fs: step time relative to full_shard", highlight=False, markup=False, style="dim")
