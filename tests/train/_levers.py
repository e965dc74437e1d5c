"""Plans with the node-aware strategies and checkpointing, for 4 workers as 2 nodes of 2
(module-level so spawned workers can unpickle the worker function)."""
from __future__ import annotations

import dataclasses

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shardsched.core.types import Plan
from shardsched.train.config import TrainConfig
from shardsched.train.trainer import train

from ._helpers import make_plan_by_hand

GPUS_PER_NODE = 2


def _on_nodes(plan: Plan, ckpt: set[str]) -> Plan:
    units = tuple(dataclasses.replace(u, checkpoint=u.name in ckpt) for u in plan.units)
    return dataclasses.replace(plan, gpus_per_node=GPUS_PER_NODE, units=units)


def lever_plans(cfg: TrainConfig, world: int) -> dict[str, Plan]:
    hybrid = make_plan_by_hand(cfg, world=world, units=[
        ("embed", ("embed",), "hybrid_shard", ("blocks.0",), ()),
        ("blocks.0", ("blocks.0",), "hybrid_shard_grad_op", (), ("embed",)),
        ("blocks.1", ("blocks.1",), "full_shard_node", (), ()),
        ("head", ("head",), "hybrid_shard", (), ("blocks.1",)),
    ])
    node = make_plan_by_hand(cfg, world=world, units=[
        ("embed", ("embed",), "full_shard_node", (), ()),
        ("blocks.0+", ("blocks.0", "blocks.1"), "full_shard_node", ("head",), ("embed",)),
        ("head", ("head",), "full_shard", (), ()),
    ])
    return {"hybrid+ckpt": _on_nodes(hybrid, {"blocks.1", "head"}),
            "node+ckpt": _on_nodes(node, {"blocks.0+"})}


def lever_worker(ctx, cfg: TrainConfig, out: str) -> None:
    torch.set_num_threads(1)
    results = {}
    for label, plan in lever_plans(cfg, ctx.world).items():
        run_cfg = dataclasses.replace(cfg, run_dir=f"{cfg.run_dir}/{label}")
        res = train(run_cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
        full = get_model_state_dict(res.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        results[label] = (list(res.losses), full)
    if ctx.rank == 0:
        torch.save(results, out)
