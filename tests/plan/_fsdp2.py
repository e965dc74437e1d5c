"""Run a plan on FSDP2 in one process standing for a worker of `world` (fake process group)
and measure its peak with FSDPMemTracker, or MemTracker for plans that run on DDP (shared by
the FSDP2 memory tests)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardsched.core.types import GradSync
from shardsched.runtime.memtrack import tracked_peak_bytes
from shardsched.runtime.parallelize import parallelize
from shardsched.verify.values import own_values


def _no_op_allreduce(_, bucket):
    """DDP's all-reduce on the fake process group: the fake PG's future carries no tensor,
    which DDP refuses; the real all-reduce runs in place on the bucket, so returning the
    bucket allocates exactly what it would."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def parallelize_on_fake_pg(model: torch.nn.Module, plan, world: int) -> torch.nn.Module:
    """`parallelize` under the fake process group; a plan that runs on DDP (runtime/ddp.py)
    gets the in-place no-op all-reduce above."""
    model = parallelize(model, plan, mesh=init_device_mesh("cpu", (world,)))
    if not isinstance(model, FSDPModule):
        model.register_comm_hook(None, _no_op_allreduce)
    return model


def measured_peak(model: torch.nn.Module, inputs: tuple, plan, *, steps: int = 2, accumulation: int = 1,
                  grad_sync: GradSync = GradSync.EVERY) -> int:
    """FSDPMemTracker's peak over `steps` training steps of `model` sharded by `plan`, each of
    `accumulation` micro-batches (`inputs` each time) as `runtime.accum.forward_backward` runs
    them, one micro-batch a tracked step: the tracker refuses a second forward of the root
    between two `reset_mod_stats`."""
    world, k = plan.world, accumulation
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        own_values(model)  # [Note: real values on the fake process group]: a model that reads values
        parallelize_on_fake_pg(model, plan, world)
        opt = (torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True) if plan.optimizer.value == "adam"
               else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True))

        def micro_step(j: int) -> None:
            if k > 1:
                if grad_sync is GradSync.LAST:
                    model.set_requires_gradient_sync(j % k == k - 1)
                (model(*inputs) / k).backward()
            else:
                model(*inputs).backward()
            if j % k == k - 1:
                opt.step()
                opt.zero_grad()

        return tracked_peak_bytes(model, opt, micro_step, steps=steps * k, inputs=inputs)["Total"]
    finally:
        dist.destroy_process_group()
