"""One plan of a traced model, its prediction beside what FSDP2 (DDP for an all-replicate plan)
on fake tensors measures (`verify_plan`)."""
from __future__ import annotations

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.build import make_plan
from shardsched.verify.engine import verify_plan


def predicted_and_verified(model, inputs, profile, strategy: str, *, fuse: bool, world: int) -> tuple[int, int]:
    """(predicted, verified) peak bytes of `strategy`'s plan, fused into units or per layer."""
    plan = make_plan(profile, Cluster(world=world, gpus_per_node=world, device=DEVICES["cpu"]), strategy=strategy,
                     fuse=fuse)
    assert (max(len(u.layers) for u in plan.units) > 1) == fuse or len(profile.layers) == 1
    return plan.predicted.peak_bytes, verify_plan(model, inputs, plan).peak_bytes


def traced_predicted_and_verified(build, strategy: str, *, fuse: bool, world: int = 4) -> tuple[int, int]:
    """`predicted_and_verified` of the model `build()` returns, traced on fake tensors (seed 0)."""
    import torch

    from shardsched.profile.trace import trace_profile
    torch.manual_seed(0)
    model, inputs = build()
    profile = trace_profile(model, inputs, name=build.__name__, device=DEVICES["cpu"])
    return predicted_and_verified(model, inputs, profile, strategy, fuse=fuse, world=world)
