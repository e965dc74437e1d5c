"""Your own training loop on shardsched: plan -> parallelize -> your loop.

    .venv/bin/python examples/own_loop.py          # 2 CPU workers (gloo); under torchrun: its workers
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.gpt import GPT, GPTConfig
from shardsched.profile.analytic import analytic_profile
from shardsched.runtime.parallelize import parallelize
from shardsched.solve.build import make_plan
from shardsched.train.launcher import launch

CONFIG = GPTConfig(vocab=256, layers=2, hidden=64, heads=4, seq=32)
BATCH, STEPS = 8, 20


def batch(step, rank=0, world=1):
    """Rows [rank*B/W, (rank+1)*B/W) of global batch `step`: byte windows of this file."""
    text = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    starts = torch.randint(0, len(text) - CONFIG.seq - 1, (BATCH,), generator=torch.Generator().manual_seed(step))
    rows = torch.stack([text[s:s + CONFIG.seq + 1] for s in starts]).chunk(world)[rank]
    return rows[:, :-1], rows[:, 1:]


def worker(ctx, out=None):
    torch.manual_seed(0)  # the same initial weights on every worker
    model = GPT(CONFIG)
    profile = analytic_profile(CONFIG, micro_batch=BATCH // ctx.world, seq=CONFIG.seq,
                               device=DEVICES["cpu"], compute_dtype="float32")
    cluster = Cluster(world=ctx.world, gpus_per_node=ctx.world, device=DEVICES["cpu"])
    budget = int(2.2 * 2**20)  # bytes per worker: too little for shard_grad_op everywhere, even checkpointed
    plan = [make_plan(profile, cluster, strategy="auto", memory_budget_bytes=budget) if ctx.rank == 0 else None]
    dist.broadcast_object_list(plan, src=0)  # rank 0 decides; every worker runs the same plan
    parallelize(model, plan[0], mesh=ctx.mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    losses = []
    for step in range(STEPS):  # your loop: nothing shardsched-specific below
        loss = model(*batch(step, ctx.rank, ctx.world))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean := loss.detach().clone())
        losses.append(mean.item() / ctx.world)
    if ctx.rank == 0:
        print(f"{len(plan[0].units)} units ({', '.join(u.strategy.value + u.checkpoint.suffix for u in plan[0].units)}); "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        if out:
            torch.save(losses, out)


if __name__ == "__main__":
    launch(worker, nproc=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
