"""`shardsched gossip compare`: every sync on real workers, same data, same steps.

Tasks: `digits` (scikit-learn's bundled 8x8 handwritten digits, load_digits: no
download; a 64-128-10 MLP) and `text` (the byte-level corpus of train/data.py and
the tiny GPT). For each global batch and algorithm: the mean over replicas of
validation accuracy / loss, bytes sent per worker per step, median step time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from shardsched.errors import UsageError
from shardsched.gossip.config import Sync, parse_syncs, parse_segments

TEXT_MODEL = "gpt:layers=2,hidden=64,heads=2,seq=32"


def add_compare_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--nproc", type=int, default=4, help="real workers (default 4)")
    c.add_argument("--task", choices=["digits", "text"], default="digits")
    c.add_argument("--batch", default="128,512", help="global batches, comma-separated")
    c.add_argument("--sync", default="allreduce,sgp,osgp,dpsgd,crossover", help="algorithms, comma-separated")
    c.add_argument("--steps", type=int, default=None, help="steps per run (default: digits 100, text 30)")
    c.add_argument("--lr", type=float, default=None, help="peak lr at batch 128 (scaled linearly, capped 8x)")
    c.add_argument("--optimizer", choices=["sgd", "lars"], default="sgd")
    c.add_argument("--segments", default="coarse", help="crossover segments (default coarse)")
    c.add_argument("--groups", type=int, default=0, help="crossover groups (default 0)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", default=None, help="also write the rows to this JSON file")


def _batches(text: str, nproc: int) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--batch {text!r}: accepted: comma-separated positive integers") from None
    bad = [b for b in batches if b < 1 or b % nproc]
    if not batches or bad:
        raise UsageError(f"--batch {text}: every batch must be a positive multiple of --nproc {nproc}")
    return batches


def run_compare(args: argparse.Namespace) -> int:
    from shardsched.gossip.config import GossipConfig, check_config
    from shardsched.train.launcher import launch
    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    syncs = parse_syncs(args.sync)
    for s in syncs:
        check_config(GossipConfig(sync=s, groups=args.groups if s is Sync.CROSSOVER else 0), world=args.nproc)
    opts = dict(task=args.task, batches=_batches(args.batch, args.nproc), syncs=[s.value for s in syncs],
                steps=args.steps or (100 if args.task == "digits" else 30),
                lr=args.lr or (0.05 if args.optimizer == "sgd" else 2.0), optimizer=args.optimizer,
                segments=parse_segments(args.segments), groups=args.groups, seed=args.seed, json=args.json)
    launch(_compare_worker, nproc=args.nproc, args=(opts,))
    return 0


class _Digits:
    def __init__(self, seed: int):
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        x = torch.tensor(x, dtype=torch.float32)[perm] / 16.0
        y = torch.tensor(y)[perm]
        cut = int(0.8 * len(y))
        self.train, self.val = (x[:cut], y[:cut]), (x[cut:], y[cut:])

    def model(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def batch(self, *, seed, step, batch, rank, world):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        idx = torch.randint(0, len(self.train[1]), (batch,), generator=g)
        rows = batch // world
        mine = idx[rank * rows:(rank + 1) * rows]
        return self.train[0][mine], self.train[1][mine]

    def loss(self, model, x, y):
        return torch.nn.functional.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model) -> tuple[float, float]:
        logits = model(self.val[0])
        loss = torch.nn.functional.cross_entropy(logits, self.val[1]).item()
        return float((logits.argmax(dim=1) == self.val[1]).float().mean()), loss


class _Text:
    def __init__(self, seed: int):
        from shardsched.train.data import load_text
        self.seq = 32
        self.data = load_text(None, batch=8, seq=self.seq)

    def model(self, seed: int) -> torch.nn.Module:
        from shardsched.train.config import TrainConfig
        from shardsched.train.task import build_model
        return build_model(TrainConfig(model=TEXT_MODEL, seq=self.seq, seed=seed))

    def batch(self, *, seed, step, batch, rank, world):
        from shardsched.train.data import get_batch
        return get_batch(self.data.train, seed=seed, step=step, batch=batch, seq=self.seq, rank=rank, world=world)

    def loss(self, model, x, y):
        return model(x, y)

    @torch.no_grad()
    def evaluate(self, model) -> tuple[float | None, float]:
        from shardsched.train.data import get_batch
        losses = [model(*get_batch(self.data.val, seed=0, step=i, batch=16, seq=self.seq, salt=1)).item()
                  for i in range(4)]
        return None, sum(losses) / len(losses)


def _optimizer(opts: dict, model: torch.nn.Module, batch: int):
    from shardsched.optim import LARS
    lr = opts["lr"] * min(8.0, batch / 128)  # linear scaling rule (Goyal et al. 2017), capped
    if opts["optimizer"] == "lars":
        return LARS(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4), lr
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), lr


def _run_one(ctx, task, opts: dict, sync: str, batch: int) -> dict:
    from shardsched.gossip.parallel import GossipDataParallel
    from shardsched.optim.schedule import set_lr, warmup_poly
    group = ctx.mesh.get_group()
    model = task.model(opts["seed"])
    gdp = GossipDataParallel(model, sync=sync, group=group, segments=opts["segments"] if sync == "crossover" else 1,
                             groups=opts["groups"] if sync == "crossover" else 0, seed=opts["seed"])
    opt, peak = _optimizer(opts, gdp.model, batch)
    times = []
    for step in range(opts["steps"]):
        t0 = time.perf_counter()
        set_lr(opt, warmup_poly(step, total=opts["steps"], peak=peak, warmup=max(1, opts["steps"] // 10)))
        x, y = task.batch(seed=opts["seed"], step=step, batch=batch, rank=ctx.rank, world=ctx.world)
        task.loss(gdp, x, y).backward()
        gdp.step(opt, step)
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    gdp.flush()
    acc, loss = task.evaluate(gdp.model)
    stats = torch.tensor([acc if acc is not None else float("nan"), loss, gdp.bytes_sent / opts["steps"],
                          statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(stats, group=group)
    stats /= ctx.world
    return {"task": opts["task"], "sync": sync, "batch": batch, "val_accuracy": None if acc is None else stats[0].item(),
            "val_loss": stats[1].item(), "bytes_per_worker_per_step": stats[2].item(),
            "step_seconds": stats[3].item(), "workers": ctx.world, "steps": opts["steps"]}


def _compare_worker(ctx, opts: dict) -> None:
    task = _Digits(opts["seed"]) if opts["task"] == "digits" else _Text(opts["seed"])
    rows = [_run_one(ctx, task, opts, sync, batch) for batch in opts["batches"] for sync in opts["syncs"]]
    if ctx.rank == 0:
        _print(rows)
        if opts["json"]:
            with open(opts["json"], "w") as f:
                json.dump(rows, f, indent=1)


def _print(rows: list[dict]) -> None:
    from rich.table import Table

    from shardsched._fmt import console, fmt_bytes
    t = Table(title=f"gossip compare: {rows[0]['task']}, {rows[0]['workers']} workers, {rows[0]['steps']} steps "
                    f"(mean over replicas)")
    for col in ("batch", "sync", "val accuracy", "val loss", "bytes/worker/step", "step time"):
        t.add_column(col, justify="left" if col == "sync" else "right")
    for r in rows:
        acc = "n/a" if r["val_accuracy"] is None else f"{100 * r['val_accuracy']:.1f}%"
        t.add_row(str(r["batch"]), r["sync"], acc, f"{r['val_loss']:.4f}", fmt_bytes(r["bytes_per_worker_per_step"]),
                  f"{r['step_seconds'] * 1e3:.1f} ms")
    console().print(t)
