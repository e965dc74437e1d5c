"""The memory of gradient accumulation against FSDPMemTracker on a fake process group.

From the second micro-batch on, the gradients of the earlier ones live through forward
and backward: sharded when reduced every micro-batch, unsharded (fp32) when FSDP2 keeps
them until the last ([Note: accumulation memory] in sim/memory.py). Each case runs two
steps of K=2 micro-batches as `train` does (`runtime.accum.forward_backward`).
"""
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardsched.core.types import GradSync
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.gpt import GPT
from shardsched.plan.schedule import scenario_for
from shardsched.runtime.memtrack import tracked_peak_bytes
from shardsched.sim.simulate import simulate
from shardsched.solve.build import make_plan
from shardsched.runtime.accum import forward_backward

from ._fsdp2 import parallelize_on_fake_pg
from .test_memory_vs_fsdp2 import CONFIGS, profile_of

WORLD, K = 8, 2
CASES = [("full_shard", "fp32"), ("shard_grad_op", "fp32"), ("full_shard,blocks.0-1=replicate", "fp32"),
         ("full_shard", "bf16-mixed"), ("shard_grad_op", "bf16-mixed")]


def accumulated_peak(model, plan, micro_batches, sync: GradSync) -> int:
    """FSDPMemTracker's peak over two steps of K micro-batches each, on rank 0 of a fake world."""
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    try:
        parallelize_on_fake_pg(model, plan, WORLD)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(_: int) -> None:
            forward_backward(model, micro_batches, grad_sync=sync)
            opt.step()
            opt.zero_grad()

        return tracked_peak_bytes(model, opt, step, steps=2, inputs=micro_batches[0])["Total"]
    finally:
        dist.destroy_process_group()


def predicted(plan, profile, cluster, sync: GradSync | None) -> int:
    if sync is not None:
        plan = dataclasses.replace(plan, accumulation=K, grad_sync=sync)
    return simulate(scenario_for(plan, profile, cluster)).predicted.peak_bytes


@pytest.mark.parametrize("strategy, precision", CASES)
def test_accumulation_memory_within_3_percent(strategy, precision):
    torch.set_num_threads(1)
    config = "gelu-4x128"
    cfg = CONFIGS[config][0]
    profile, x, y = profile_of(config, precision)
    cluster = Cluster(world=WORLD, gpus_per_node=WORLD, device=DEVICES["cpu"])
    plan = make_plan(profile, cluster, strategy=strategy, precision=precision, optimizer="adam", fuse=False)
    micro = [(x, y)] * K  # the same shape each micro-batch: memory does not depend on the values
    once = predicted(plan, profile, cluster, None)
    rows = []
    for sync in GradSync:
        torch.manual_seed(0)
        measured = accumulated_peak(GPT(cfg), plan, micro, sync)
        rows.append((sync.value, measured, predicted(plan, profile, cluster, sync)))
    for sync, measured, pred in rows:
        assert abs(pred / measured - 1) < 0.03, (strategy, precision, rows)
    # Keeping unsharded gradients costs more than keeping shards, and both more than no accumulation.
    (_, m_every, p_every), (_, m_last, p_last) = rows
    assert once < p_every < p_last and m_every < m_last
