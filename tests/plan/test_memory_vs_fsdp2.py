"""The plan's predicted peak against real FSDP2, measured by FSDPMemTracker.

One CPU process stands for a worker of a world of 8 or 64 through PyTorch's fake
process group: FSDP2 allocates exactly what a real worker would (shards, gather
and reduce buffers), and the collectives are no-ops.
"""
import functools

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.build import make_plan
from shardsched.profile.measure import measure_profile
from shardsched.runtime.memtrack import tracked_peak_bytes
from shardsched.models.gpt import GPT, GPTConfig
from ._fsdp2 import parallelize_on_fake_pg

CONFIGS = {
    # activation-heavy MLPs
    "gelu-4x128": (GPTConfig(vocab=256, layers=4, hidden=128, heads=4, seq=128), 4),
    # parameter-heavy LLaMA-style blocks
    "swiglu-3x256": (GPTConfig(vocab=512, layers=3, hidden=256, heads=4, seq=64, mlp="swiglu",
                               norm="rmsnorm", bias=False), 2),
    # logits-heavy: large vocabulary and sequence
    "gelu-6x64-v1024": (GPTConfig(vocab=1024, layers=6, hidden=64, heads=2, seq=256), 8),
}
CASES = [("replicate", "fp32", "adam"), ("shard_grad_op", "fp32", "adam"), ("full_shard", "fp32", "adam"),
         ("full_shard,blocks.0-1=replicate,head=shard_grad_op", "fp32", "adam"),
         ("full_shard", "bf16-mixed", "sgd"), ("shard_grad_op,head=replicate", "bf16-mixed", "adam")]


@functools.lru_cache(maxsize=None)
def profile_of(config: str, precision: str):
    """The measured profile of a config in a precision's compute dtype, and its inputs
    (measured once per pair: its bytes do not change between calls)."""
    cfg, micro_batch = CONFIGS[config]
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq))
    y = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq))
    dtype = "bfloat16" if precision == "bf16-mixed" else "float32"
    return measure_profile(GPT(cfg), (x, y), name="t", repeats=1, warmup=0, compute_dtype=dtype), x, y


def measured_and_predicted(config: str, world: int, strategy: str,
                           precision: str, optimizer: str) -> tuple[int, int]:
    cfg = CONFIGS[config][0]
    profile, x, y = profile_of(config, precision)
    plan = make_plan(profile, Cluster(world=world, gpus_per_node=world, device=DEVICES["cpu"]),
                     strategy=strategy, precision=precision, optimizer=optimizer, fuse=False)
    return fsdp_peak(GPT(cfg), plan, world, x, y, optimizer), plan.predicted.peak_bytes


def fsdp_peak(model, plan, world: int, x, y, optimizer: str) -> int:
    """FSDPMemTracker's peak of two steps of `plan` on rank 0 of a fake world."""
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        parallelize_on_fake_pg(model, plan, world)
        opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
               else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))

        def step(_: int) -> None:
            model(x, y).backward()
            opt.step()
            opt.zero_grad()

        return tracked_peak_bytes(model, opt, step, steps=2, inputs=(x, y))["Total"]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [8, 64])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_predicted_peak_within_3_percent(config, world):
    torch.set_num_threads(1)
    errors = []
    for strategy, precision, optimizer in CASES:
        measured, predicted = measured_and_predicted(config, world, strategy, precision, optimizer)
        err = predicted / measured - 1
        print(f"{config:16s} world={world:3d} {strategy:52s} {precision:10s} {optimizer:4s} "
              f"measured={measured / 2**20:7.2f} MiB predicted={predicted / 2**20:7.2f} MiB error={err:+.1%}")
        errors.append((strategy, precision, err))
    bad = [e for e in errors if abs(e[2]) > 0.03]
    assert not bad, f"prediction off by more than 3%: {bad}"
