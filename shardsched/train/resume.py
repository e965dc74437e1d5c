"""What `train --resume RUN_DIR` reuses from the saved run, and the one line saying so.

A resumed run continues the saved one unless a flag says otherwise: the same
number of workers (`--nproc`), the same plan (RUN_DIR/plan.json, when the
world is unchanged; else the saved strategy and budget, re-planned for the new
world) and the same config (model, batch, seq, lr, steps, ...: `train.args.FROM_SAVED`).
Nothing switches silently: the line printed names what was reused, and
`archive_if_changed` keeps any run file that a resume would change.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from shardsched.train.validate import run_dir_of

DEFAULT_NPROC = 2
"""Workers when neither --nproc nor a resumed run says how many."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a checkpoint copied without its run directory: flags and defaults apply


def _plan_label(plan: dict) -> str:
    kinds = sorted({u.get("strategy", "?") for u in plan.get("units", [])})
    return "/".join(kinds) if len(kinds) <= 3 else "mixed"


def reuse_saved_run(args: argparse.Namespace, *, world_from_launcher: int | None,
                    from_saved: tuple[str, ...]) -> str | None:
    """Fill args' unset flags from the saved run (in place); the line saying what was reused.

    world_from_launcher: the world torchrun/SLURM imposes (None when spawning locally)."""
    if not args.resume:
        args.nproc = DEFAULT_NPROC if args.nproc is None else args.nproc
        return None
    run_dir = run_dir_of(args.resume)
    config, plan = _read_json(run_dir / "config.json"), _read_json(run_dir / "plan.json")
    reused = []
    if args.nproc is None:
        args.nproc = plan.get("world") or DEFAULT_NPROC
        if plan.get("world"):
            reused.append(f"{args.nproc} workers")
    world = world_from_launcher or args.nproc
    if args.plan is None and args.strategy is None and args.memory_budget is None:
        if plan and plan.get("world") == world:
            args.plan = str(run_dir / "plan.json")
            reused.append(f"its plan {args.plan} ({_plan_label(plan)})")
        elif config:
            args.plan = config.get("plan")
            args.strategy = None if args.plan else config.get("strategy")
            budget = config.get("memory_budget_bytes")
            args.memory_budget = str(budget) if budget and not args.plan else None
            what = args.plan or f"strategy {args.strategy or 'auto'}"
            reused.append(f"{what} re-planned for {world} workers (it ran on {plan.get('world', '?')})")
    kept = [f"{k}={config[k]}" for k in from_saved if getattr(args, k, None) is None and config.get(k) is not None]
    if kept:
        reused.append("config " + ", ".join(kept))
    if not reused:
        return None
    return f"resume: reusing from {run_dir}: " + "; ".join(reused) + " (flags given override these)"


def archive_if_changed(path: Path, text: str, *, tag: str, ignore: tuple[str, ...] = ()) -> str | None:
    """Write text (JSON) to path; if path held different content (keys in `ignore`
    aside), keep it as <stem>.<tag><suffix> first. Returns the line telling the
    user, or None when nothing was kept aside."""
    def strip(t: str) -> dict:
        obj = json.loads(t)
        return {k: v for k, v in obj.items() if k not in ignore} if isinstance(obj, dict) else obj
    note = None
    if path.exists() and _differs(path.read_text(), text, strip):
        kept = path.with_name(f"{path.stem}.{tag}{path.suffix}")
        path.replace(kept)
        note = f"{path.name} changed on resume; the previous one is kept as {kept.name}"
    path.write_text(text)
    return note


def _differs(old: str, new: str, strip) -> bool:
    try:
        return strip(old) != strip(new)
    except ValueError:
        return True  # an unreadable old file is kept aside too
