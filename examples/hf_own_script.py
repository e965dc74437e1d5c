"""Your own FSDP2 script for a Hugging Face model, sharded by a plan the CLI made.

    .venv/bin/shardsched plan --model hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512 \
        --world 2 --device cpu --micro-batch 4 --seq 32 --memory-budget 3MiB --out runs/hf-plan.json
    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/hf_own_script.py runs/hf-plan.json

The model is `AutoModelForCausalLM.from_config(...)` with the same config the `hf:`
spec names: the plan's layer names and fingerprint are that model's own, so
`parallelize` applies it as is. Everything else is plain PyTorch: the process group,
the mesh, the optimizer and the loop.
"""
import gc
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import transformers
from transformers import AutoModelForCausalLM, GPT2Config

import shardsched

transformers.logging.set_verbosity_error()  # its config notes (e.g. GPT-2's bos id above a small vocabulary)

CONFIG = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=512)
BATCH, SEQ, STEPS = 8, 32, 10


def batch(step: int, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of global batch `step`: a repeating token pattern the model can learn."""
    gen = torch.Generator().manual_seed(step)
    start = torch.randint(0, 64, (BATCH, 1), generator=gen)
    rows = (start + torch.arange(SEQ)) % 64
    return rows.chunk(world)[rank]


def main(plan_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same initial weights on every rank (FSDP2 shards, it does not broadcast)
    model = AutoModelForCausalLM.from_config(GPT2Config(**CONFIG))
    plan = shardsched.load_plan(plan_path)
    shardsched.parallelize(model, plan, mesh=mesh)  # checks fingerprint, layers and world first
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    losses = []
    for step in range(STEPS):  # your loop
        ids = batch(step, rank, world)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean := loss.detach().clone())
        losses.append(mean.item() / world)
    if rank == 0:
        kinds = ", ".join(u.strategy.value + u.checkpoint.suffix for u in plan.units)
        print(f"{len(plan.units)} units ({kinds}); loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    # Leave together, and free the sharded model while the group still exists: gloo objects
    # left to interpreter shutdown can abort the process ("terminate called without an
    # active exception"; shardsched/train/launcher.py does the same).
    dist.barrier()
    del model, opt, mesh, loss, mean
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/hf-plan.json")
