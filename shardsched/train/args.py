"""`train`'s flags as a run's `TrainConfig`: the given flags, else the resumed run's saved
config, else the defaults; and the run's world. Shared by `shardsched train`, `shardsched
bench` (`commands/`) and gossip training (`gossip.train`)."""
from __future__ import annotations

import argparse
import time

from shardsched.cost.bytes import parse_bytes
from shardsched.cost.headroom import parse_headroom
from shardsched.errors import UsageError
from shardsched.train.config import TrainConfig
from shardsched.train.validate import check_config, check_train_args, read_saved_config

DEFAULT_STEPS = 500
"""About a minute for the tiny model with 2 workers on 2 CPU cores (measured ~0.09 s/step: 500 steps ~ 45 s plus ~7 s start-up: planning, verifying, forking the workers)."""

def model_choices() -> str:
    """What `--model` accepts besides `python:` and `hf:` (its help and its errors say it)."""
    from shardsched.models.spec import PRESETS
    return f"a preset ({', '.join(PRESETS)}) or gpt:key=value,..."


# Flags a resumed run takes from the saved config.json unless given again.
FROM_SAVED = ("steps", "seed", "model", "data", "batch", "seq", "lr", "eval_every", "checkpoint_every", "precision",
               "cluster", "layers", "headroom", "micro_batch", "grad_sync", "choose_batch")
DEFAULTS = {"steps": DEFAULT_STEPS, "seed": 0, "model": "tiny", "batch": 8, "seq": 128, "lr": 3e-3,
             "eval_every": 100, "checkpoint_every": 0, "precision": "fp32", "choose_batch": False}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig from flags, the resumed run's config.json, then defaults."""
    check_train_args(args)
    saved = read_saved_config(args.resume, model=args.model)
    values = {}
    for key in FROM_SAVED:
        given = getattr(args, key, None)
        values[key] = given if given is not None else saved.get(key, DEFAULTS.get(key))
    budget = parse_bytes(args.memory_budget) if args.memory_budget else None
    if getattr(args, "headroom", None) is not None:
        parse_headroom(args.headroom)  # one line, exit 2, before any worker starts
    from shardsched.train.resume import run_dir_of
    resumed_dir = str(run_dir_of(args.resume)) if args.resume else None  # --resume may name a checkpoint
    run_dir = args.run_dir or resumed_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = TrainConfig(**values, strategy=args.strategy, plan=args.plan, memory_budget_bytes=budget,
                      run_dir=run_dir, resume=args.resume, quiet=args.quiet,
                      log_every=getattr(args, "log_every", 0),
                      gpus_per_node=getattr(args, "gpus_per_node", None),
                      verify=not getattr(args, "no_verify", False))
    check_config(cfg)  # ranges first: later checks (host memory, planning) assume them
    return cfg


def world_size(nproc: int) -> int:
    """Workers of this run: the launcher's world under torchrun/SLURM, else --nproc."""
    from shardsched.train.launcher import check_nproc
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    return check_nproc(nproc)
