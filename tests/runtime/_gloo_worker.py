"""Worker side of tests/runtime/test_gloo.py (module-level, so spawned workers can unpickle it)."""
from __future__ import annotations

import json

import torch
import torch.distributed as dist

from shardsched.runtime.gloo import SettledAllGather, SettledReduceScatter, _holders

N = 1000


def comms(model) -> list[str]:
    """The AllGather and ReduceScatter each FSDP2 parameter group of `model` uses."""
    from torch.distributed.fsdp import FSDPModule
    return sorted({type(c).__name__ for m in model.modules() if isinstance(m, FSDPModule)
                   for g in m._get_fsdp_state()._fsdp_param_groups
                   for c in (g._all_gather_comm, g._reduce_scatter_comm)})


def lagging(ctx, plan_json: str, out: str) -> None:
    """Per rank, how many of N AllGathers still had a holder beyond the caller's right after
    `wait()`: FSDP2's default path (`dist.all_gather_single`) and `SettledAllGather`'s; how many
    of N `SettledReduceScatter`s left one on their input (each checked against the mean); and
    the collectives `parallelize` gave a plan's modules on this gloo group."""
    from shardsched.core.types import Plan
    from shardsched.runtime.parallelize import parallelize
    from tests.verify import user_models as um
    torch.set_num_threads(1)
    group, world = ctx.mesh.get_group(), ctx.world
    counts = {"default": 0, "settled": 0, "reduce": 0,
              "comms": comms(parallelize(um.build_lstm()[0], Plan.from_json(plan_json), mesh=ctx.mesh))}
    for kind in ("default", "settled"):
        for _ in range(N):
            inp, output = torch.randn(4096), torch.empty(world * 4096)
            before = _holders(output)
            if kind == "default":
                work = dist.all_gather_single(output, inp, group=group, async_op=True)
            else:
                work = SettledAllGather()(output, inp, group, async_op=True)
            work.wait()
            del work
            counts[kind] += _holders(output) > before
            assert torch.equal(output.view(world, -1)[ctx.rank], inp)
    for i in range(N):  # (world, 4096) gradients of rank r are r + 1 + i: the mean is (world + 1) / 2 + i
        inp, output = torch.full((world * 4096,), float(ctx.rank + 1 + i)), torch.empty(4096)
        before = _holders(inp)
        SettledReduceScatter()(output, inp, group, dist.ReduceOp.AVG)
        counts["reduce"] += _holders(inp) > before
        assert torch.equal(output, torch.full((4096,), (world + 1) / 2 + i))
    gathered = [None] * world
    dist.all_gather_object(gathered, counts, group=group)
    if ctx.rank == 0:
        with open(out, "w") as fh:
            json.dump(gathered, fh)
