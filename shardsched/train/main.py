"""`shardsched train`: flags, validation in the parent, then the workers.

Everything a user can get wrong (flags, the data file, the plan file, the
checkpoint to resume) is checked here, before any worker starts, so a mistake
is one line on stderr and exit status 2 instead of a worker's traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from shardsched.cost.bytes import parse_bytes
from shardsched.errors import UsageError
from shardsched.train.config import TrainConfig

DEFAULT_STEPS = 500
"""About a minute for the tiny model with 2 workers on 2 CPU cores (measured ~0.09 s/step: 500 steps ~ 45 s plus ~10 s start-up and profiling)."""

def _model_choices() -> str:
    from shardsched.models.spec import PRESETS
    return f"a preset ({', '.join(PRESETS)}) or gpt:key=value,..."


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `shardsched train`. Defaults are None where --resume takes the saved value."""
    a = parser.add_argument
    a("--nproc", type=int, default=None,
      help="local workers to spawn (default 2; with --resume: the saved run's; ignored under torchrun/SLURM)")
    a("--steps", type=int, default=None, help=f"total optimizer steps (default {DEFAULT_STEPS})")
    a("--seed", type=int, default=None, help="seed for initialisation and batches (default 0)")
    a("--model", default=None, help=f"model spec: {_model_choices()}; python:module:function returning "
                                    "(model, example_inputs[, batch_fn]) (see shardsched.train.task; default tiny)")
    a("--data", default=None, help="text file to train on (default: the Python standard library sources)")
    a("--strategy", default=None,
      help='full_shard | shard_grad_op | replicate | auto, with overrides like "full_shard,blocks.0-1=replicate" '
           "(default auto, under --memory-budget or a default budget midway between least memory and shard_grad_op)")
    a("--plan", default=None,
      help="plan.json to apply (from `shardsched plan --json`; with --resume: default the saved run's plan)")
    a("--memory-budget", default=None, help="per-worker memory budget, e.g. 2GiB, 512MiB")
    a("--gpus-per-node", type=int, default=None,
      help="workers per node; must divide the world (default: all workers on one node)")
    a("--run-dir", default=None, help="output directory (default runs/<timestamp>; with --resume: that run)")
    a("--checkpoint-every", type=int, default=None, help="save a checkpoint every N steps (default 0: never)")
    a("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest usable checkpoint")
    a("--batch", type=int, default=None, help="global batch in sequences (default 8)")
    a("--seq", type=int, default=None, help="tokens per sequence (default 128)")
    a("--lr", type=float, default=None, help="peak AdamW learning rate (default 3e-3)")
    a("--eval-every", type=int, default=None, help="validation loss every N steps (default 100; 0: never)")
    a("--precision", choices=["fp32", "bf16-mixed"], default=None,
      help="fp32, or bf16 gathers and compute with fp32 master weights and reductions (default fp32)")
    a("--cluster", default=None, help="cluster file from `shardsched profile --out` (default: this machine's device preset)")
    a("--quiet", action="store_true", help="no progress (bar or lines) and no final table; train.log is still written")
    a("--log-every", type=int, default=0,
      help="without a terminal, a progress line every N steps (default 0: about ten lines per run)")
    from shardsched.gossip.train import add_gossip_train_arguments
    add_gossip_train_arguments(parser)  # --sync, --segments, --groups, --topology, --optimizer


# Flags a resumed run takes from the saved config.json unless given again.
_FROM_SAVED = ("steps", "seed", "model", "data", "batch", "seq", "lr", "eval_every", "checkpoint_every", "precision",
               "cluster")
_DEFAULTS = {"steps": DEFAULT_STEPS, "seed": 0, "model": "tiny", "batch": 8, "seq": 128, "lr": 3e-3,
             "eval_every": 100, "checkpoint_every": 0, "precision": "fp32"}


def _saved_config(resume: str | None) -> dict:
    if not resume:
        return {}
    from shardsched.train.resume import run_dir_of
    path = run_dir_of(resume)
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}  # a checkpoint copied without its run directory: flags and defaults apply


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig from flags, the resumed run's config.json, then defaults."""
    saved = _saved_config(args.resume)
    values = {}
    for key in _FROM_SAVED:
        given = getattr(args, key, None)
        values[key] = given if given is not None else saved.get(key, _DEFAULTS.get(key))
    budget = parse_bytes(args.memory_budget) if args.memory_budget else None
    from shardsched.train.resume import run_dir_of
    resumed_dir = str(run_dir_of(args.resume)) if args.resume else None  # --resume may name a checkpoint
    run_dir = args.run_dir or resumed_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    return TrainConfig(**values, strategy=args.strategy, plan=args.plan, memory_budget_bytes=budget,
                       run_dir=run_dir, resume=args.resume, quiet=args.quiet,
                       log_every=getattr(args, "log_every", 0),
                       gpus_per_node=getattr(args, "gpus_per_node", None))


def validate(cfg: TrainConfig, *, world: int) -> TrainConfig:
    """Check everything checkable before workers start; returns cfg with the
    checkpoint to resume from resolved (messages about skipped ones printed here)."""
    from shardsched.plan.spec import parse_strategy_spec
    from shardsched.train import checkpoint as ckpt
    from shardsched.train.planning import load_plan, run_device
    from shardsched.train.task import check_task
    for name in ("steps", "seq"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("checkpoint_every", "eval_every"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(cfg, name)}")
    if cfg.lr <= 0:
        raise UsageError(f"--lr must be positive, got {cfg.lr}")
    if cfg.gpus_per_node is not None and (cfg.gpus_per_node < 1 or world % cfg.gpus_per_node):
        raise UsageError(f"--gpus-per-node {cfg.gpus_per_node} must divide the world {world} "
                         f"(accepted: a divisor, e.g. 2 for 4 workers as 2 nodes of 2)")
    if cfg.plan is None:
        parse_strategy_spec(cfg.strategy or "auto")
    run_device(cfg)  # a bad --cluster file is one line here
    built, task = check_task(cfg, world=world)  # the model builds and its loss is a scalar
    if cfg.plan:
        load_plan(cfg.plan, model=built.model, world=world)
    if cfg.resume:
        found = ckpt.find_checkpoint(cfg.resume, log=lambda m: print(m, file=sys.stderr))
        cfg = dataclasses.replace(cfg, resume=str(found))
    _check_run_dir_is_free(cfg)
    for note in task.notes:  # only once the input is good: an error stays one line
        print(f"note: {note}", file=sys.stderr)
    return cfg


def _check_run_dir_is_free(cfg: TrainConfig) -> None:
    """A new run must not mix its checkpoints with another run's: a good old
    checkpoint is never overwritten, so the new one would silently be lost."""
    from shardsched.train.checkpoint import checkpoint_dir
    existing = sorted(checkpoint_dir(cfg.run_dir).glob("step_*")) if checkpoint_dir(cfg.run_dir).is_dir() else []
    resumed_here = cfg.resume and Path(cfg.resume).resolve().parent.parent == Path(cfg.run_dir).resolve()
    if existing and not resumed_here:
        raise UsageError(f"{cfg.run_dir} already holds checkpoints of another run; "
                         f"continue it with --resume {cfg.run_dir} or pick another --run-dir")


def world_size(nproc: int) -> int:
    """Workers of this run: the launcher's world under torchrun/SLURM, else --nproc."""
    from shardsched.train.launcher import external_rendezvous
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    rdzv = external_rendezvous()
    return rdzv.world if rdzv else nproc


def _train_worker(ctx, cfg: TrainConfig) -> None:
    from shardsched.train.trainer import train
    train(cfg, mesh=ctx.mesh, rank=ctx.rank, device=ctx.device)


def run_train(args: argparse.Namespace) -> int:
    """`shardsched train`: 0 on success; UsageError for bad input (the CLI exits 2);
    1 with a line naming the worker when a worker fails."""
    from shardsched.gossip.train import run_gossip_train, wants_gossip
    if wants_gossip(args):
        return run_gossip_train(args)
    from shardsched.train.launcher import WorkerFailed, external_rendezvous, launch
    from shardsched.train.hostmem import check_local_workers
    from shardsched.train.resume import reuse_saved_run
    rdzv = external_rendezvous()
    reused = reuse_saved_run(args, world_from_launcher=rdzv and rdzv.world, from_saved=_FROM_SAVED)
    world = world_size(args.nproc)
    cfg = config_from_args(args)
    check_local_workers(cfg, world=world, external=rdzv is not None)  # before anything builds the model
    cfg = validate(cfg, world=world)
    if reused and not cfg.quiet and _is_first_process():
        print(reused, flush=True)
    try:
        launch(_train_worker, nproc=world, args=(cfg,))
    except WorkerFailed as e:
        print(f"shardsched train: {e}", file=sys.stderr)
        return 1
    if _is_first_process():
        from shardsched.report.run import write_report
        png = write_report(cfg.run_dir)
        if not cfg.quiet:
            print(f"run directory: {cfg.run_dir} (report: {png})")
    return 0


def _is_first_process() -> bool:
    """Under torchrun/SLURM every worker runs this command; only rank 0 speaks."""
    from shardsched.train.launcher import external_rendezvous
    rdzv = external_rendezvous()
    return rdzv is None or rdzv.rank == 0
