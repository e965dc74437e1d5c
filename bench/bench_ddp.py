"""Replicate vs DDP, side by side in one run on 2 gloo workers (issue 8: target <= 1.05).

    python bench/bench_ddp.py [--model tiny] [--steps 40] [--nproc 2]

Three variants of the same all-replicate training run inside the same worker
processes, interleaved step by step so that they share cores, caches and any
background load equally:
- `shardsched`: `parallelize(model, plan)` with every unit replicate, which is
  what `shardsched train --strategy replicate` runs (DDP's engine, runtime/ddp.py);
- `fsdp2`: the same plan forced onto FSDP2's (world, 1) mesh, as before issue 8;
- `ddp`: `torch.nn.parallel.DistributedDataParallel`, the reference.
Prints the median step time of each, the ratios to DDP and the largest
relative loss difference to DDP (parity: the same batches, the same init).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from shardsched.core.types import Plan, Strategy, Unit
from shardsched.profile.fingerprint import fingerprint
from shardsched.runtime import parallelize as par
from shardsched.train.config import TrainConfig
from shardsched.train.task import build_model
from shardsched.train.data import get_batch, load_text
from shardsched.train.launcher import launch
from shardsched.train.trainer import build_optimizer


def replicate_plan(model: torch.nn.Module, world: int) -> Plan:
    layers = [f"{n}.{i}" if isinstance(m, torch.nn.ModuleList) else n
              for n, m in model.named_children() for i in (range(len(m)) if isinstance(m, torch.nn.ModuleList) else [0])]
    return Plan(fingerprint=fingerprint(model), world=world, gpus_per_node=world, units=tuple(
        Unit(name=n, layers=(n,), strategy=Strategy.REPLICATE,
             params=sum(p.numel() for p in model.get_submodule(n).parameters())) for n in layers))


def _variants(cfg: TrainConfig, mesh) -> dict:
    plan = replicate_plan(build_model(cfg), mesh.size())
    ours = par.parallelize(build_model(cfg), plan, mesh=mesh)
    fsdp = build_model(cfg)
    par.parallelize(fsdp, plan, mesh=mesh, ddp=False)  # the pre-issue-8 path, for comparison
    ddp = DistributedDataParallel(build_model(cfg), process_group=mesh.get_group(),
                                  gradient_as_bucket_view=True)
    return {name: (m, build_optimizer(m, cfg))
            for name, m in (("shardsched", ours), ("fsdp2", fsdp), ("ddp", ddp))}


def _worker(ctx, cfg: TrainConfig, out: str) -> None:
    data = load_text(None, batch=cfg.batch, seq=cfg.seq)
    variants = _variants(cfg, ctx.mesh)
    times = {k: [] for k in variants}
    losses = {k: [] for k in variants}
    for step in range(cfg.steps):
        x, y = get_batch(data.train, seed=cfg.seed, step=step, batch=cfg.batch, seq=cfg.seq,
                         rank=ctx.rank, world=ctx.world)
        names = list(variants)
        for name in names[step % 3:] + names[:step % 3]:  # rotate the order: no variant always goes first
            model, opt = variants[name]
            t0 = time.perf_counter()
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)
            losses[name].append(loss.item())
    if ctx.rank == 0:
        Path(out).write_text(json.dumps({"times": times, "losses": losses}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    cfg = TrainConfig(model=args.model, steps=args.steps, seq=args.seq, batch=8)
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result.json"
        launch(_worker, nproc=args.nproc, args=(cfg, out))
        res = json.loads(Path(out).read_text())
    skip = min(5, args.steps // 4)  # warm-up steps (first-touch allocations, DDP's bucket rebuild)
    med = {k: statistics.median(v[skip:]) for k, v in res["times"].items()}
    ref = res["losses"]["ddp"]
    print(f"replicate vs DDP: {args.model}, {args.nproc} gloo workers, {args.steps} steps interleaved, "
          f"median after {skip} warm-up steps")
    print(f"{'variant':>12} {'step ms':>9} {'vs ddp':>7} {'max loss diff vs ddp':>21}")
    for k, m in med.items():
        diff = max(abs(a - b) / abs(b) for a, b in zip(res["losses"][k], ref))
        print(f"{k:>12} {m * 1e3:9.2f} {m / med['ddp']:6.3f}x {diff:21.2e}")
    ratio = med["shardsched"] / med["ddp"]
    print(f"replicate/DDP step-time ratio: {ratio:.3f} (target <= 1.05){'' if ratio <= 1.05 else '  ABOVE TARGET'}")


if __name__ == "__main__":
    main()
