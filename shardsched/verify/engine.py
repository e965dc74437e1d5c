"""One plan run once by the engine, on fake tensors over a fake process group.

`verify_plan(model, inputs, plan)` applies `plan` with the runtime's own `parallelize` to a
fake copy of `model` (`verify.fake`) on PyTorch's fake process group at `plan.world` (every
collective returns at once, each output allocated as the real one is), runs two whole
training steps as the trainer runs them (every micro-batch of an accumulating plan, backward,
the optimizer's step and `zero_grad(set_to_none=True)`) and returns `core.types.Verified`:
FSDPMemTracker's peak and where it happened. Two steps, because the optimizer's state first
exists in the second step's forward. Every rank of a data-parallel plan runs the same program
on the same shapes, so rank 0's peak is every rank's (`tests/verify` compares real gloo runs).

[Note: plans that run on DDP, verified without DDP]
An all-replicate fp32 plan runs on DDP (`runtime.ddp`), whose C++ reducer reads its buckets'
storage at construction, which a fake tensor does not have. With `gradient_as_bucket_view`
the buckets are the gradients, allocated once and kept across steps; the plain model with
every gradient allocated up front and zeroed in place stands for it (MemTracker, as the
runtime's own measurement of DDP plans, `runtime.memtrack`).

[Note: the fake world is this process's own]
The fake process group becomes the default group for the run and is destroyed after it, so
verification needs a process with no process group of its own (the `plan` command, a user's
script before `init_process_group`). Inside a training worker it runs in a fresh interpreter
(`verify_in_subprocess`), which rebuilds the model from its `--model` spec.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from shardsched.profile.fake_rules import FakeRules
from shardsched.core.types import GradSync, Optimizer, Plan, Verified
from shardsched.runtime.ddp import runs_on_ddp
from shardsched.runtime.memtrack import tracked_peak
from shardsched.runtime.parallelize import parallelize
from shardsched.runtime.scalars import optimizer_param_groups
from shardsched.verify.chunks import chunks_on_demand
from shardsched.verify.fake import fake_copy, fake_inputs

STEPS = 2
"""Training steps run: the optimizer's state is first alive in the second.

[Note: the first step untracked] FSDPMemTracker costs Python per op and per tracked module
(Llama-2-70B: half the verification), and the first step's peak is never above the second's
(the second holds the optimizer's state from its start, the first creates it at its end), so
the first runs untracked and the tracker, entered with every parameter and optimizer state
alive, counts the second."""


@contextlib.contextmanager
def fake_world(world: int):
    """PyTorch's fake process group as this process's default group, for the block."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        raise RuntimeError("verification needs a process without a process group "
                           "([Note: the fake world is this process's own])")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _optimizer(model: nn.Module, plan: Plan) -> torch.optim.Optimizer:
    """The plan's optimizer, one parameter at a time.

    [Note: the optimizer on fake tensors] On fake DTensors, AdamW's foreach kernels take
    another sharding path than on real ones: the fake step held 27x the sharded parameters
    (a small GPT at world 8: 66.6 MB of state against 4.9 MB for the same step on real
    tensors), so verification steps parameter by parameter, whose state and one temporary
    per parameter are what the real foreach step holds beside its list of temporaries."""
    groups = optimizer_param_groups(model)
    if plan.optimizer is Optimizer.SGD:
        return torch.optim.SGD(groups, lr=1e-3, momentum=0.9, foreach=False)
    return torch.optim.AdamW(groups, lr=1e-3, foreach=False)


def _loss(out) -> torch.Tensor:
    from shardsched.profile.trace_fake import loss_of
    return loss_of(out)


def training_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: tuple, plan: Plan,
                  seen: Callable[[nn.Module], None] = lambda m: None) -> Callable[[int], None]:
    """`step(i)`: one optimizer step of `plan.accumulation` micro-batches (`runtime.accum`);
    `seen(model)` after the backward of the first step, before the gradients are freed."""
    from shardsched.runtime.accum import forward_backward
    k = plan.accumulation

    def step(i: int) -> None:
        forward_backward(model, [inputs] * k, grad_sync=plan.grad_sync if k > 1 else GradSync.EVERY, loss_of=_loss)
        if i == 0:
            seen(model)
        opt.step()
        opt.zero_grad(set_to_none=not getattr(model, "_shardsched_bucket_view", False))
    return step


def _as_ddp(model: nn.Module) -> None:
    """[Note: plans that run on DDP, verified without DDP]: from the first step's backward on,
    every gradient is allocated (the buckets) and zeroed in place."""
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    model._shardsched_bucket_view = True


def _run(model: nn.Module, inputs: tuple, plan: Plan) -> tuple:
    """(TrackedPeak, engine, unused parameter names) of two steps of `plan` on `model`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():  # a mesh holds a real tensor of ranks
        mesh = init_device_mesh("cpu", (plan.world,))
    ddp = runs_on_ddp(plan)
    if ddp:
        from shardsched.runtime.parallelize import check_plan
        check_plan(model, plan, plan.world)
    else:
        with chunks_on_demand():  # [Note: chunks read one at a time]
            model = parallelize(model, plan, mesh=mesh)
    opt = _optimizer(model, plan)
    unused: list[str] = []

    def seen(m: nn.Module) -> None:  # after the first backward: who got no gradient
        unused.extend(n for n, p in m.named_parameters() if p.requires_grad and p.grad is None)
        if ddp:
            _as_ddp(m)

    step = training_step(model, opt, inputs, plan, seen=seen)
    step(0)  # [Note: the first step untracked]
    peak = tracked_peak(model, opt, lambda i: step(i + 1), steps=1, inputs=inputs)
    return peak, ("ddp" if ddp else "fsdp2"), unused


def verify_plan(model: nn.Module, inputs: tuple, plan: Plan, *, tensors: str = "fake") -> Verified:
    """Run `plan` once on a fake copy of `model` (see the module docstring); `model` and
    `inputs` (one worker's micro-batch, real or on the meta device) are untouched.
    tensors="real": on `model` itself, real (a copy the caller made: `verify.subject`)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True) if tensors == "fake" else contextlib.nullcontext()
    with fake_world(plan.world), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's view warnings: the run is ours, not the user's
        if tensors == "fake":
            model, inputs = fake_copy(model, mode), fake_inputs(inputs, mode)
        with mode, (FakeRules() if tensors == "fake" else contextlib.nullcontext()):
            peak, engine, unused = _run(model, inputs, plan)
    return Verified(peak_bytes=peak.by_kind["Total"], peak_at=peak.at, engine=engine, tensors=tensors,
                    memory={k: v for k, v in peak.by_kind.items() if k != "Total" and v},
                    unused_params=tuple(unused))
