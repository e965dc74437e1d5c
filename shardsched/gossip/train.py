"""`shardsched train --sync ...`: the training loop for gossip data parallelism.

The same run directory as `train` (config.json, metrics.jsonl, summary.json,
checkpoints/ with COMPLETE manifests), the same data (train/data.py: worker r
takes rows [rB/W, (r+1)B/W) of global batch `step`), the same launcher; the
model is replicated whole on every worker and wrapped in GossipDataParallel.
A checkpoint holds every replica (gossip/checkpoint.py); resume restores each
rank's own model, optimizer, push-sum weight and in-flight OSGP message.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from shardsched.errors import UsageError
from shardsched.gossip import checkpoint as gckpt
from shardsched.gossip.config import GossipConfig, Sync, Topology, check_config, parse_segments, parse_sync
from shardsched.gossip.parallel import GossipDataParallel
from shardsched.optim import LARS, warmup_poly
from shardsched.train.config import TrainConfig


def add_gossip_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The gossip flags of `shardsched train`."""
    a = parser.add_argument
    a("--sync", default=None, help="decentralised data parallelism instead of a sharding plan: "
                                   "allreduce | sgp | osgp | dpsgd | crossover")
    a("--segments", default=None, help="crossover: segments per model, an integer or coarse | fine (default 1)")
    a("--groups", type=int, default=None, help="crossover: contiguous rank groups (all-reduce inside, gossip between roots)")
    a("--topology", choices=[t.value for t in Topology], default=None, help="dpsgd neighbours (default ring)")
    a("--optimizer", choices=["adamw", "lars"], default=None, help="adamw (default) or lars (with --sync)")


@dataclass(frozen=True, kw_only=True)
class GossipTrainConfig:
    train: TrainConfig
    """Everything `train` is given (steps, data, model, run directory, ...)."""
    gossip: GossipConfig
    """Sync algorithm, segments, groups, topology."""
    optimizer: str = "adamw"
    """adamw, or lars (warmup then poly(2) decay)."""


def wants_gossip(args: argparse.Namespace) -> bool:
    """--sync given, or --resume of a run that was a gossip run."""
    from shardsched.train.validate import read_saved_config
    if getattr(args, "sync", None):
        return True
    return "gossip" in read_saved_config(getattr(args, "resume", None), model=getattr(args, "model", None))


def _refuse_sharding(args: argparse.Namespace, world: int) -> None:
    if args.strategy not in (None, "replicate") or args.memory_budget:
        raise UsageError(f"--sync keeps a whole replica per worker; it cannot be combined with "
                         f"--strategy {args.strategy or 'auto'} / --memory-budget (use --strategy replicate or none)")
    if args.plan:
        from shardsched.train.planning import load_plan
        from shardsched.train.task import build_model
        from shardsched.train.args import config_from_args
        plan = load_plan(args.plan, model=build_model(config_from_args(args)), world=world)
        sharded = [u.name for u in plan.units if u.strategy.value != "replicate"]
        if sharded:
            raise UsageError(f"--sync cannot run plan {args.plan}: it shards parameters of {sharded[0]} "
                             f"(gossip needs every unit replicate)")


def gossip_config_from_args(args: argparse.Namespace, world: int) -> GossipTrainConfig:
    from shardsched.train.args import config_from_args
    from shardsched.train.validate import read_saved_config
    saved = read_saved_config(args.resume, model=args.model).get("gossip", {})
    pick = lambda name, default: getattr(args, name) if getattr(args, name) is not None else saved.get(name, default)
    gossip = GossipConfig(sync=parse_sync(pick("sync", "sgp")), segments=parse_segments(pick("segments", 1)),
                          groups=pick("groups", 0), topology=Topology(pick("topology", "ring")),
                          seed=args.seed if args.seed is not None else saved.get("seed", 0))
    check_config(gossip, world=world)
    train = dataclasses.replace(config_from_args(args), strategy="replicate", plan=None)
    return GossipTrainConfig(train=train, gossip=gossip, optimizer=pick("optimizer", "adamw"))


def run_gossip_train(args: argparse.Namespace) -> int:
    """Validate in the parent (one line, exit 2 on bad input), then launch the workers."""
    from shardsched.gossip.segments import segment_bounds
    from shardsched.train.task import build_model
    from shardsched.train.launcher import WorkerFailed, launch
    from shardsched.train.args import world_size
    from shardsched.train.validate import validate
    from shardsched.train.resume import DEFAULT_NPROC
    world = world_size(DEFAULT_NPROC if args.nproc is None else args.nproc)
    _refuse_sharding(args, world)
    cfg = gossip_config_from_args(args, world)
    train = validate(cfg.train, world=world).cfg
    segment_bounds(build_model(train), cfg.gossip.segments)  # UsageError for too many segments
    if train.resume:
        gckpt.check_resumable(Path(train.resume), world=world)
    cfg = dataclasses.replace(cfg, train=train)
    try:
        launch(_worker, nproc=world, args=(cfg,))
    except WorkerFailed as e:
        print(f"shardsched train: {e}", file=sys.stderr)
        return 1
    if not train.quiet:
        print(f"run directory: {train.run_dir}")
    return 0


def _worker(ctx, cfg: GossipTrainConfig) -> None:
    gossip_train(cfg, group=ctx.mesh.get_group(), rank=ctx.rank, device=ctx.device)


def make_optimizer(name: str, model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if name == "lars":
        return LARS(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_for(cfg: GossipTrainConfig, step: int) -> float:
    t = cfg.train
    if cfg.optimizer == "lars":
        return warmup_poly(step, total=t.steps, peak=t.lr, warmup=min(t.warmup, max(1, t.steps // 10)))
    from shardsched.train.trainer import lr_at
    return lr_at(step, steps=t.steps, lr=t.lr, warmup=t.warmup)


def _mean(value: float, group) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


@dataclass
class _Run:
    cfg: GossipTrainConfig
    group: dist.ProcessGroup
    rank: int
    device: torch.device
    gdp: GossipDataParallel
    opt: torch.optim.Optimizer
    data: object


def _setup(cfg: GossipTrainConfig, *, group, rank: int, device: torch.device) -> _Run:
    from shardsched.train.task import build_model
    from shardsched.train.data import check_divisible, load_text
    t, g = cfg.train, cfg.gossip
    check_divisible(batch=t.batch, world=dist.get_world_size(group))
    model = build_model(t).to(device)
    gdp = GossipDataParallel(model, sync=g.sync, group=group, segments=g.segments, groups=g.groups,
                             topology=g.topology, seed=g.seed)
    opt = make_optimizer(cfg.optimizer, gdp.model, t)
    return _Run(cfg=cfg, group=group, rank=rank, device=device, gdp=gdp, opt=opt,
                data=load_text(t.data, batch=t.batch, seq=t.seq))


def _step(run: _Run, step: int) -> float:
    from shardsched.optim.schedule import set_lr
    from shardsched.train.data import get_batch
    t = run.cfg.train
    x, y = get_batch(run.data.train, seed=t.seed, step=step, batch=t.batch, seq=t.seq,
                     rank=run.rank, world=dist.get_world_size(run.group))
    set_lr(run.opt, lr_for(run.cfg, step))
    loss = run.gdp(x.to(run.device), y.to(run.device))
    loss.backward()
    run.gdp.step(run.opt, step)
    run.opt.zero_grad(set_to_none=True)
    return _mean(loss.item(), run.group)


@torch.no_grad()
def _evaluate(run: _Run) -> float:
    """Mean over replicas of each replica's validation loss on the same batches."""
    from shardsched.train.data import get_batch
    t = run.cfg.train
    total = 0.0
    for i in range(t.eval_batches):
        x, y = get_batch(run.data.val, seed=t.seed, step=i, batch=t.batch, seq=t.seq, salt=1)
        total += run.gdp.model(x.to(run.device), y.to(run.device)).item()
    return _mean(total / t.eval_batches, run.group)


def _save(run: _Run, step: int) -> None:
    state = {"model": run.gdp.model.state_dict(), "optim": run.opt.state_dict(), "gossip": run.gdp.gossip_state(),
             "bytes_sent": run.gdp.bytes_sent}
    meta = {"world": dist.get_world_size(run.group), "data_position": step, "config": _config_json(run.cfg)}
    gckpt.save_replicas(run.cfg.train.run_dir, step=step, state=state, group=run.group, rank=run.rank, meta=meta)


def _resume(run: _Run) -> int:
    state, meta = gckpt.load_replica(Path(run.cfg.train.resume), rank=run.rank, world=dist.get_world_size(run.group))
    run.gdp.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optim"])
    run.gdp.load_gossip_state(state["gossip"])
    if meta["step"] > run.cfg.train.steps:
        raise UsageError(f"checkpoint {run.cfg.train.resume} is at step {meta['step']}, beyond --steps {run.cfg.train.steps}")
    return int(meta["step"])


def _config_json(cfg: GossipTrainConfig) -> dict:
    g = cfg.gossip
    return {**dataclasses.asdict(cfg.train), "optimizer": cfg.optimizer,
            "gossip": {"sync": g.sync.value, "segments": g.segments, "groups": g.groups,
                       "topology": g.topology.value, "optimizer": cfg.optimizer}}


def _progress(cfg: GossipTrainConfig, *, rank: int, start: int, world: int):
    """The same progress as `train` (a bar on a terminal, ~10 lines otherwise) on rank 0:
    a gossip run of many minutes is never silent."""
    from shardsched.train.progress import Progress, ProgressMode, default_every, progress_mode
    t = cfg.train
    mode = progress_mode(quiet=t.quiet, stream=sys.stdout) if rank == 0 else ProgressMode.QUIET
    progress = Progress(mode=mode, start=start, total=t.steps,
                        every=t.log_every or default_every(start=start, total=t.steps))
    progress.begin(f"{t.model}, {world} workers, --sync {cfg.gossip.sync.value}")
    return progress


def _loop(run: _Run, steps: range, losses: list, seconds: list, progress) -> None:
    from shardsched.train.trainer import _metrics_path
    cfg, t, rank = run.cfg, run.cfg.train, run.rank
    for step in steps:
        t0 = time.perf_counter()
        loss = _step(run, step)
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
        val = _evaluate(run) if t.eval_every and (step + 1) % t.eval_every == 0 else None
        if rank == 0:
            row = {"step": step + 1, "loss": loss, "tokens_per_s": t.batch * t.seq / seconds[-1],
                   "step_seconds": seconds[-1], "lr": lr_for(cfg, step), "sync": cfg.gossip.sync.value,
                   "bytes_sent": run.gdp.bytes_sent}
            if val is not None:
                row["val_loss"] = val
            with open(_metrics_path(t), "a") as f:
                f.write(json.dumps(row) + "\n")
        if t.checkpoint_every and (step + 1) % t.checkpoint_every == 0:
            _save(run, step + 1)
        progress.update(step + 1, loss=loss, tokens_per_s=t.batch * t.seq / seconds[-1],
                        step_seconds=seconds[-1], val_loss=val)


def gossip_train(cfg: GossipTrainConfig, *, group, rank: int, device: torch.device | None = None) -> dict:
    """Train on every rank of `group`; returns the summary (rank 0 also writes the run directory)."""
    from shardsched.train.trainer import _prepare_metrics
    run = _setup(cfg, group=group, rank=rank, device=device or torch.device("cpu"))
    t = cfg.train
    start = _resume(run) if t.resume else 0
    if rank == 0:
        Path(t.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(t.run_dir) / "config.json").write_text(json.dumps(_config_json(cfg), indent=1))
        _prepare_metrics(t, start)
    losses, seconds = [], []
    bytes_before = run.gdp.bytes_sent
    progress = _progress(cfg, rank=rank, start=start, world=dist.get_world_size(group))
    try:
        _loop(run, range(start, t.steps), losses, seconds, progress)
    finally:
        progress.close()
    run.gdp.flush()
    steps_run = max(1, t.steps - start)
    median = statistics.median(seconds) if seconds else None
    summary = {"first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "last_val_loss": _evaluate(run) if t.eval_every else None,
               "steps": t.steps, "start_step": start, "world": dist.get_world_size(group), "model": t.model,
               "batch": t.batch, "seq": t.seq, "sync": cfg.gossip.sync.value, "optimizer": cfg.optimizer,
               "measured_peak_bytes": None, "predicted_peak_bytes": None, "predicted_step_seconds": None,
               "measured_step_seconds": median, "tokens_per_s": t.batch * t.seq / median if median else None,
               "bytes_per_worker_per_step": _mean(run.gdp.bytes_sent - bytes_before, group) / steps_run}
    if rank == 0:
        (Path(t.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        if not t.quiet:
            print(f"{cfg.gossip.sync.value}: loss {summary['first_loss']} -> {summary['last_loss']}, "
                  f"{summary['bytes_per_worker_per_step']:.0f} bytes/worker/step, "
                  f"median step {median:.4f} s" if median else "no steps run", flush=True)
    summary["params"] = torch.nn.utils.parameters_to_vector(run.gdp.model.parameters()).detach().clone()
    summary["weight"] = run.gdp.gossip_state()["weight"]
    return summary
