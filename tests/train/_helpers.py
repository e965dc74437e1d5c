"""Shared pieces of the train tests: a tiny model, hand-built plans, a
single-process reference trainer, and worker functions (module-level, so the
spawned workers can unpickle them)."""
from __future__ import annotations

import dataclasses

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shardsched.core.types import Plan, Strategy, Unit
from shardsched.profile.fingerprint import fingerprint
from shardsched.train.config import TrainConfig
from shardsched.train.task import build_model
from shardsched.train.task import build, make_task
from shardsched.train.trainer import lr_at, train

TINY = "gpt:layers=2,hidden=32,heads=2,seq=16"
LAYERS = ("embed", "blocks.0", "blocks.1", "head")


def tiny_config(run_dir: str, **kw) -> TrainConfig:
    base = dict(steps=20, seed=3, model=TINY, batch=8, seq=16, lr=3e-3, run_dir=run_dir,
                quiet=True, measure_memory=False)
    return TrainConfig(**{**base, **kw})


def _params(model: torch.nn.Module, layers: tuple[str, ...]) -> int:
    return sum(p.numel() for n in layers for p in model.get_submodule(n).parameters())


def make_plan_by_hand(cfg: TrainConfig, *, world: int, units: list[tuple[str, tuple[str, ...], str, tuple, tuple]]) -> Plan:
    """units: (name, layers, strategy, forward_prefetch, backward_prefetch)."""
    model = build_model(cfg)
    return Plan(fingerprint=fingerprint(model), world=world, gpus_per_node=world, units=tuple(
        Unit(name=n, layers=ls, strategy=Strategy(s), params=_params(model, ls),
             forward_prefetch=fp, backward_prefetch=bp) for n, ls, s, fp, bp in units))


def uniform_plan(cfg: TrainConfig, *, world: int, strategy: str) -> Plan:
    return make_plan_by_hand(cfg, world=world, units=[(n, (n,), strategy, (), ()) for n in LAYERS])


def mixed_plan(cfg: TrainConfig, *, world: int) -> Plan:
    """Three strategies, a two-layer unit, and explicit prefetch lists both ways."""
    return make_plan_by_hand(cfg, world=world, units=[
        ("embed", ("embed",), "replicate", ("blocks.0",), ()),
        ("blocks.0", ("blocks.0",), "shard_grad_op", ("blocks.1+",), ("embed",)),
        ("blocks.1+", ("blocks.1", "head"), "full_shard", (), ("blocks.0",)),
    ])


def plans_for(cfg: TrainConfig, world: int) -> dict[str, Plan]:
    plans = {s: uniform_plan(cfg, world=world, strategy=s) for s in ("replicate", "shard_grad_op", "full_shard")}
    plans["mixed"] = mixed_plan(cfg, world=world)
    return plans


def reference_run(cfg: TrainConfig, *, chunks: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single process, no sharding, the whole global batch: what every plan must reproduce.

    With chunks=W the batch's gradient is the mean of W row-chunk gradients, the
    same arithmetic as W workers (the summation order differs from chunks=1 only
    in the last bits, which Adam amplifies for near-zero gradients)."""
    torch.set_num_threads(1)  # as the workers: thread count changes matmul summation order
    built = build(cfg, world=1)
    task, model = make_task(cfg, built, world=1), built.model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    losses = []
    for step in range(cfg.steps):
        inputs = task.train_batch(step, 0, 1)  # the whole global batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup)
        loss = 0.0
        for part_inputs in zip(*(t.chunk(chunks) for t in inputs)):
            part = model(*part_inputs)  # one worker's loss: the mean over its rows
            part.backward()
            loss += part.item() / chunks
        for p in model.parameters():
            p.grad /= chunks  # the workers' gradients are summed, then divided by the world
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def parity_worker(ctx, cfg: TrainConfig, out: str) -> None:
    """Train under every plan in turn; rank 0 saves losses and gathered parameters."""
    results = {}
    for label, plan in plans_for(cfg, ctx.world).items():
        run_cfg = dataclasses.replace(cfg, run_dir=f"{cfg.run_dir}/{label}",
                                      measure_memory=label == "mixed")
        res = train(run_cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
        full = get_model_state_dict(res.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        results[label] = (list(res.losses), full, res.summary)
    if ctx.rank == 0:
        torch.save(results, out)


def train_worker(ctx, cfg: TrainConfig) -> None:
    train(cfg, mesh=ctx.mesh, rank=ctx.rank)


def auto_worker(ctx, cfg: TrainConfig, out: str) -> None:
    """Train under the plan the trainer makes itself (auto, cfg's budget)."""
    res = train(cfg, mesh=ctx.mesh, rank=ctx.rank)
    if ctx.rank == 0:
        torch.save((list(res.losses), res.summary), out)


def plan_worker(ctx, cfg: TrainConfig, plan: Plan, out: str) -> None:
    """Train under one given plan; rank 0 saves the losses and the summary."""
    res = train(cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
    if ctx.rank == 0:
        torch.save((list(res.losses), res.summary), out)
