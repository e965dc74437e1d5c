"""`shardsched train`: flags, validation in the parent, then the workers.

Everything a user can get wrong (flags, the data file, the plan file, the
checkpoint to resume) is checked here, before any worker starts, so a mistake
is one line on stderr and exit status 2 instead of a worker's traceback.
"""
from __future__ import annotations

import argparse

from shardsched._flags import add_headroom_argument, add_layers_argument
from shardsched.train.args import DEFAULT_STEPS, FROM_SAVED, config_from_args, model_choices, world_size
from shardsched.train.config import TrainConfig
from shardsched.train.validate import validate


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `shardsched train`. Defaults are None where --resume takes the saved value."""
    a = parser.add_argument
    a("--nproc", type=int, default=None, help="local workers to spawn (default 2; with --resume: the saved run's); "
                                             "under torchrun/SLURM the launcher's tasks are the workers and --nproc must match them")
    a("--steps", type=int, default=None, help=f"total optimizer steps (default {DEFAULT_STEPS})")
    a("--seed", type=int, default=None, help="seed for initialisation and batches (default 0)")
    a("--model", default=None, help=f"model spec: {model_choices()}; python:module:function returning "
                                    "(model, example_inputs[, batch_fn]) (see shardsched.train.task; default tiny)")
    add_layers_argument(parser)
    a("--data", default=None, help="text file to train on (default: the Python standard library sources)")
    a("--strategy", default=None,
      help='full_shard | shard_grad_op | replicate | auto, with overrides like "full_shard,blocks.0-1=replicate" '
           "(default auto, under --memory-budget or a default budget midway between least memory and shard_grad_op)")
    a("--plan", default=None,
      help="plan.json to apply (from `shardsched plan --json`; with --resume: default the saved run's plan)")
    a("--memory-budget", default=None, help="per-worker memory budget, e.g. 2GiB, 512MiB")
    add_headroom_argument(parser)
    a("--no-verify", action="store_true",
      help="skip running a plan made here once under FSDP2 on fake tensors before training (see `plan --no-verify`)")
    a("--gpus-per-node", type=int, default=None,
      help="workers per node; must divide the world (default: all workers on one node)")
    a("--run-dir", default=None, help="output directory (default runs/<timestamp>; with --resume: that run)")
    a("--checkpoint-every", type=int, default=None, help="save a checkpoint every N steps (default 0: never)")
    a("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest usable checkpoint")
    a("--batch", dest="batch", type=int, default=None,
      help="global batch in sequences: rows of one optimizer step across all workers (default 8)")
    a("--global-batch", dest="batch", type=int, default=None, action=_GlobalBatch,
      help="--batch, and the planner chooses the micro-batch and --grad-sync that are not given "
           "(fastest per global batch, as `plan --global-batch`)")
    a("--micro-batch", type=int, default=None,
      help="rows per worker per micro-batch; each step accumulates global-batch / (workers x micro-batch) of them "
           "(default: the plan's, else global-batch / workers: no accumulation)")
    a("--grad-sync", choices=["every", "last"], default=None,
      help="with accumulation, reduce gradients after every micro-batch (less memory) or only after the last "
           "(less communication); default: the plan's, else every")
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


class _GlobalBatch(argparse.Action):
    """`--global-batch N`: the global batch, and `TrainConfig.choose_batch`."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.choose_batch = True


def _train_worker(ctx, cfg: TrainConfig, plan=None) -> None:
    from shardsched.train.trainer import train
    train(cfg, mesh=ctx.mesh, rank=ctx.rank, device=ctx.device, plan=plan)  # rank 0 also writes RUN_DIR/train.log


def run_train(args: argparse.Namespace) -> int:
    """`shardsched train`: 0 on success; UsageError for bad input (the CLI exits 2);
    1 with a line naming the worker when a worker fails."""
    from shardsched.gossip.train import run_gossip_train, wants_gossip
    if wants_gossip(args):
        return run_gossip_train(args)
    from shardsched.train.console import report
    from shardsched.train.interrupt import Interrupted
    from shardsched.train.launcher import WorkerFailed, external_rendezvous, launch
    from shardsched.train.lock import run_dir_lock
    from shardsched.train.hostmem import check_local_workers
    from shardsched.train.resume import reuse_saved_run
    from shardsched.train.validate import check_user_model_shape
    rdzv = external_rendezvous()
    reused = reuse_saved_run(args, world_from_launcher=rdzv and rdzv.world, from_saved=FROM_SAVED)
    world = world_size(args.nproc)
    cfg = config_from_args(args)
    check_local_workers(cfg, world=world, external=rdzv is not None)  # before anything builds the model
    checked = validate(cfg, world=world)
    cfg = checked.cfg
    check_user_model_shape(args)
    if reused and not cfg.quiet and _is_first_process():
        print(reused, flush=True)
    plan = None
    if rdzv is None:  # [Note: planned before the workers start]
        from shardsched.train.planning import plan_before_workers
        plan = plan_before_workers(checked, world=world)
    del checked
    try:
        with run_dir_lock(cfg.run_dir, enabled=_is_first_process()):
            launch(_train_worker, nproc=world, args=(cfg, plan))
    except WorkerFailed as e:
        report(cfg.run_dir, f"shardsched train: {e}")
        return 1
    except Interrupted as e:
        if _is_first_process():
            report(cfg.run_dir, f"shardsched train: {e}" + (f" after step {e.step}" if e.step else "")
                   + (f"; resume with --resume {cfg.run_dir}" if cfg.checkpoint_every else ""))
        return e.exit_code
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
