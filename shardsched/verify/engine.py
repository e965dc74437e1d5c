"""One plan run once by the engine, on fake tensors over a fake process group.

`verify_plan(model, inputs, plan)` applies `plan` with the runtime's own `parallelize` to a
fake copy of `model` (`verify.fake`) on PyTorch's fake process group at `plan.world` (every
collective returns at once, each output allocated as the real one is), runs one whole
training step as the trainer runs it (the micro-batches of an accumulating plan, [Note: the
middle micro-batches are one], backward, the optimizer's step and `zero_grad(set_to_none=True)`), entered with the optimizer's state alive
([Note: the optimizer's state without a first step]), and returns `core.types.Verified`:
FSDPMemTracker's peak and where it happened. Every rank of a data-parallel plan runs the same
program on the same shapes, so rank 0's peak is every rank's (`tests/verify` compares real gloo runs).

[Note: plans that run on DDP, verified without DDP]
An all-replicate fp32 plan runs on DDP (`runtime.ddp`), whose C++ reducer reads its buckets'
storage at construction, which a fake tensor does not have. With `gradient_as_bucket_view`
the buckets are the gradients, allocated once and kept across steps; the plain model with
every gradient allocated up front and zeroed in place stands for it (MemTracker, as the
runtime's own measurement of DDP plans, `runtime.memtrack`).

[Note: the middle micro-batches are one]
An accumulating step's micro-batches differ in what exists when they start, not in what they
run: the first allocates the gradients (sharded under `every`, unsharded under `last`), the
last reduces them under `last`, and every one between starts from the state the second started
from (the same gradients, added to in place) and leaves it so. Their peaks are the second's, to
the byte, so the run makes the first, one middle and the last micro-batch: a step of 32 costs 3
(tests/verify/test_engine.py runs both and compares).

[Note: the fake world is this process's own]
The fake process group becomes the default group for the run and is destroyed after it, so
verification needs a process with no process group of its own (the `plan` command, a user's
script before `init_process_group`). Inside a training worker it runs in a fresh interpreter
(`verify_in_subprocess`), which rebuilds the model from its `--model` spec.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from shardsched.profile.fake_rules import FakeRules, cold_fake_mode
from shardsched.profile.trace_fake import hf_one_sequence_per_row
from shardsched.core.types import GradSync, Plan, Verified
from shardsched.runtime.ddp import runs_on_ddp
from shardsched.runtime.memtrack import TrackedPeak, tracked_peak
from shardsched.runtime.parallelize import parallelize
from shardsched.verify.chunks import chunks_on_demand
from shardsched.verify.fake import fake_copy, fake_inputs
from shardsched.verify.no_sync import with_no_sync
from shardsched.verify.optimizer import LocalShardOptimizer
from shardsched.verify.values import own_values

STEPS = 1
"""Training steps run under the tracker, after the optimizer's state is made without one.

[Note: the optimizer's state without a first step] The peak of a training step is that of
its second: the first creates the optimizer's state only at its end, the second holds it from
its start. A first step on fake tensors costs as much as the measured one (GPT-3 175B at
world 1024: 20 of 32 s) and leaves behind only that state (and, for plans on DDP, the
gradient buckets), so both are made directly: every trainable parameter gets a zero gradient,
the optimizer steps once (creating its state as its first step does: `exp_avg`, `exp_avg_sq`,
`step`) and the gradients are set to None again (kept, zeroed, for DDP). FSDPMemTracker,
entered with every parameter and optimizer state alive, then counts one whole step: FSDP2's
lazy initialisation, in that step's first forward, allocates nothing that outlives it.
Parameters that get no gradient are read after that step's backward: `grad is None` under
FSDP2; a hook on every gradient's accumulation under DDP, whose buckets already exist."""


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


def _loss(out) -> torch.Tensor:
    from shardsched.profile.trace_fake import loss_of
    return loss_of(out)


def run_micro_batches(accumulation: int) -> int:
    """How many micro-batches of an accumulating step the run makes ([Note: the middle
    micro-batches are one]): all of them up to 3, else the first, one middle one and the last."""
    return min(accumulation, 3)


class TrainingSteps(NamedTuple):
    """A training step cut where a memory tracker needs it: `run(i)` runs micro-batch
    i % per_step of optimizer step i // per_step (and the optimizer after the last)."""

    run: Callable[[int], None]
    per_step: int


def training_step(model: nn.Module, opt, inputs: tuple, plan: Plan,
                  seen: Callable[[nn.Module], None] = lambda m: None) -> TrainingSteps:
    """One optimizer step of `plan.accumulation` micro-batches (`runtime.accum`, [Note: the
    middle micro-batches are one]), one micro-batch a call: FSDPMemTracker takes a second
    forward of the root as a second iteration; `seen(model)` after the backward of the first
    step, before the gradients are freed. `opt`: a torch.optim optimizer, or verification's
    `LocalShardOptimizer`. The plain model standing for DDP has `set_requires_gradient_sync` when
    it accumulates under `last` ([Note: DDP's no_sync beside its buckets]); else it needs none,
    its buckets being its gradients ([Note: plans that run on DDP, verified without DDP])."""
    from shardsched.runtime.accum import micro_step
    k = run_micro_batches(plan.accumulation)
    sync = plan.grad_sync if hasattr(model, "set_requires_gradient_sync") else GradSync.EVERY

    def run(i: int) -> None:
        j = i % k
        micro_step(model, inputs, j, k, grad_sync=sync, loss_of=_loss)
        if j < k - 1:
            return
        if i == k - 1:
            seen(model)
        opt.step()
        opt.zero_grad(set_to_none=not getattr(model, "_shardsched_bucket_view", False))
    return TrainingSteps(run, k)


def _initial_state(model: nn.Module, opt: LocalShardOptimizer, *, ddp: bool) -> None:
    """[Note: the optimizer's state without a first step]; for DDP also [Note: plans that run
    on DDP, verified without DDP]: every gradient allocated (the buckets) and zeroed in place."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=not ddp)
    model._shardsched_bucket_view = ddp


def _gradient_seen(model: nn.Module) -> set[int]:
    """ids of the parameters whose gradient autograd accumulates from now on (DDP's check for
    unused parameters: their gradients already exist, so `grad is None` cannot tell)."""
    got: set[int] = set()
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: got.add(id(q)))
    return got


def _run(model: nn.Module, inputs: tuple, plan: Plan, *, real: bool = False) -> tuple:
    """(TrackedPeak, engine, unused parameter names) of one step of `plan` on `model`; `real`:
    its tensors are real ([Note: real values on the fake process group] in verify/values.py)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():  # a mesh holds a real tensor of ranks
        mesh = init_device_mesh("cpu", (plan.world,))
    ddp = runs_on_ddp(plan)
    if real:
        own_values(model)
    if ddp:
        from shardsched.runtime.parallelize import check_plan
        check_plan(model, plan, plan.world)
    else:
        with chunks_on_demand():  # [Note: chunks read one at a time]
            model = parallelize(model, plan, mesh=mesh)
    opt = LocalShardOptimizer(model, plan)
    _initial_state(model, opt, ddp=ddp)
    if ddp and plan.accumulation > 1 and plan.grad_sync is GradSync.LAST:
        with_no_sync(model)  # [Note: DDP's no_sync beside its buckets]
    got = _gradient_seen(model) if ddp else None
    unused: dict[str, nn.Parameter] = {}
    slots: list[torch.Tensor] = []  # DDP: the bucket slots of unused parameters, kept

    def seen(m: nn.Module) -> None:  # after the backward: who got no gradient
        for n, p in m.named_parameters():
            if p.requires_grad and (id(p) not in got if ddp else p.grad is None):
                unused[n] = p
                if ddp:  # DDP's reducer leaves an unused parameter's `.grad` as it was: None
                    slots.append(p.grad)
                    p.grad = None

    steps = training_step(model, opt, inputs, plan, seen=seen)
    peak = tracked_peak(model, opt.inner, steps.run, steps=STEPS * steps.per_step, inputs=inputs)
    return without_state(peak, opt.state_bytes(unused.values())), ("ddp" if ddp else "fsdp2"), list(unused)


def without_state(peak: TrackedPeak, nbytes: int) -> TrackedPeak:
    """[Note: the optimizer state of unused parameters] The state made before the step
    ([Note: the optimizer's state without a first step]) gave every trainable parameter
    `exp_avg` and `exp_avg_sq`; AdamW makes none for a parameter that never gets a gradient
    ([Note: parameters a step never uses] in profile/unused.py). Which those are is known only
    after the step's backward; their state was alive, untouched, at every moment of the step
    (AdamW skips a parameter whose `.grad` is None), so the step without it peaks at the same
    moment, lower by exactly its bytes."""
    if not nbytes:
        return peak
    kinds = dict(peak.by_kind)  # MemTracker's kind is "Optstate", FSDPMemTracker's "OptState"
    for k in ("Total", next((k for k in ("OptState", "Optstate") if k in kinds), "Optstate")):
        kinds[k] = kinds.get(k, 0) - nbytes
    return peak._replace(by_kind=kinds)


def verify_plan(model: nn.Module, inputs: tuple, plan: Plan, *, tensors: str = "fake") -> Verified:
    """Run `plan` once on a fake copy of `model` (see the module docstring); `model` and
    `inputs` (one worker's micro-batch, real or on the meta device) are untouched.
    tensors="real": on `model` itself, real (a copy the caller made: `verify.subject`)."""
    # [Note: a cold fake-tensor cache]
    mode = cold_fake_mode(allow_non_fake_inputs=True) if tensors == "fake" else contextlib.nullcontext()
    with fake_world(plan.world), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's view warnings: the run is ours, not the user's
        if tensors == "fake":
            model, inputs = fake_copy(model, mode), fake_inputs(inputs, mode)
        # [Note: HF causal masks on fake tensors]: the run builds no (batch, 1, T, T) mask either
        with mode, (FakeRules() if tensors == "fake" else contextlib.nullcontext()), hf_one_sequence_per_row():
            peak, engine, unused = _run(model, inputs, plan, real=tensors == "real")
    return Verified(peak_bytes=peak.by_kind["Total"], peak_at=peak.at, engine=engine, tensors=tensors,
                    memory={k: v for k, v in peak.by_kind.items() if k != "Total" and v},
                    unused_params=tuple(unused))
