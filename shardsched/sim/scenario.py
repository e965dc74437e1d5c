"""What the simulator replays: units with costs, strategies and a schedule.

Compute steps are indexed 0 .. 2n: forward of unit i is step i, backward of
unit i is step 2n-1-i, the optimizer step is 2n. A schedule gives, for every
AllGather, the step at whose start it is launched:
  forward_launch[i]  in [0, i]          (i itself: no prefetch)
  backward_launch[i] in [n, 2n-1-i]     (strategies that gather for backward:
                                         full_shard, full_shard_node, hybrid_shard;
                                         2n-1-i: no prefetch)
which maps one-to-one onto FSDP2's `set_modules_to_forward_prefetch` /
`set_modules_to_backward_prefetch` lists (`plan.schedule`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from shardsched.cost.device import Cluster
from shardsched.cost.memory import StateBytes
from shardsched.cost.strategy import shard_count
from shardsched.core.types import Checkpoint, GradSync, Strategy
from shardsched.sim.unit_cost import UnitCost, code_held_terms


@dataclass(frozen=True, kw_only=True)
class Scenario:
    units: tuple[UnitCost, ...]
    strategies: tuple[Strategy, ...]
    forward_launch: tuple[int, ...]
    backward_launch: tuple[int | None, ...]
    cluster: Cluster
    state: StateBytes
    input_bytes: int = 0
    optimizer_seconds: float = 0.0
    optimizer_workspace_factor: float = 0.0
    """Transient bytes of the optimizer step, per byte of persistent fp32 params
    (foreach Adam materialises a few parameter-sized temporaries)."""
    loss_bytes: int = 8
    """`Profile.loss_bytes`: the loss and the gradient `backward()` seeds it with, live from the
    loss's forward to the end of backward (counted throughout: in forward, an upper bound)."""
    buffer_bytes: int = 0
    """`Profile.buffer_bytes`: whole on every worker, all step long."""
    optimizer_scalar_bytes: int = 0
    """Live from the first step on, on the device: Adam's `step`, one fp32 scalar per
    parameter tensor, which torch.optim keeps on the CPU unless fused or capturable (so on a
    GPU it is host memory, 0 here)."""
    checkpoint: tuple = ()
    """Per unit: activation checkpointing, a `Checkpoint` (or a bool: full or none; empty:
    none anywhere). A selective unit's `UnitCost` is its selective form, so every moment
    below reads it as checkpointed ([Note: selective checkpointing as kept bytes])."""
    root_tied_numel: int = 0
    """`Profile.root_tied_numel`: the root's tied tensors, whose gradient a DDP backward holds
    throughout (`sim.memory` [Note: plans that run on DDP])."""
    accumulation: int = 1
    """Micro-batches per optimizer step (gradient accumulation; the units' costs are one micro-batch's)."""
    grad_sync: GradSync = GradSync.EVERY
    """When gradients are reduced under accumulation (`core.types.GradSync`)."""

    @property
    def on_ddp(self) -> bool:
        """Every unit replicate in fp32 (compute copy = the fp32 master), none checkpointed:
        the plan runs on DDP, not FSDP2 (`runtime.ddp.runs_on_ddp`), whose memory differs
        (`sim.memory`)."""
        return (all(s is Strategy.REPLICATE for s in self.strategies) and self.state.unsharded_param == self.state.param
                and not any(self.checkpoint))

    # [Note: the output a recomputed unit hands over]
    # The trace counts a saved storage once, at the layer that saved it first: a unit's input
    # that the layer before saved (a ReLU's output) is in that layer's activations, not in its
    # own. When the unit before recomputes (full or selective) it saves nothing of it, but this
    # unit still saves it (a conv saves its input), or keeps it when it recomputes too. So a
    # recomputing unit followed by one that does not retains its output beside its inputs
    # (`retained_bytes`), and at that unit's copy-out the input is live either way
    # (`UnitCost.entry_after_checkpointed`). In the MILP the product of the two units'
    # checkpoint binaries is one exact column (`solve.milp`, `handed`). A CNN after a selective
    # block ran 0.3% over its budget without it (3 of 212 auto plans).

    @property
    def accumulates_in_place(self) -> bool:
        """Accumulation keeps the gradients unsharded in their own dtype until the last
        micro-batch (GradSync.LAST, no separate reduce dtype): autograd adds into
        `unsharded_param.grad` ([Note: accumulation memory] in sim/memory.py)."""
        sb = self.state
        return self.accumulation > 1 and self.grad_sync is GradSync.LAST and sb.reduce == sb.unsharded_grad

    @property
    def accumulates_sharded(self) -> bool:
        """Accumulation reduces every micro-batch (GradSync.EVERY): from the second micro-batch
        on every sharded gradient exists and FSDP2 adds each new reduced one into it, so a fused
        unit's layers reduced so far hold nothing beyond `sim.memory.accumulation_bytes` (counted
        anew, a BatchNorm CNN fused whole and accumulating 2 was 1.8% over), unless the unit
        all-reduces (`cost.strategy.all_reduces`: FSDP2 keeps those buffers; a Mixer fused under
        replicate, accumulating 2, was 6.8% under without them)."""
        return self.accumulation > 1 and self.grad_sync is GradSync.EVERY

    def ckpt(self, i: int) -> bool:
        """Unit i recomputes in backward (full or selective)."""
        return bool(self.checkpoint) and bool(self.checkpoint[i])

    def mode(self, i: int) -> Checkpoint:
        return Checkpoint(self.checkpoint[i]) if self.checkpoint else Checkpoint.NONE

    def code_held_bytes(self, i: int) -> int:
        """Bytes the calling code holds beside unit i's forward under this plan's checkpointing."""
        modes = {Checkpoint.FULL: 1, Checkpoint.SELECTIVE: 2, Checkpoint.SELECTIVE_ALL: 3}
        return self.units[i].code_held_bytes + sum(
            (0, *t)[modes.get(self.mode(j), 0)] for j, *t in code_held_terms(self.units, i))

    def retained_bytes(self, i: int) -> int:
        """Activations unit i keeps from its forward to its backward; recomputing, followed by
        a unit that does not, its output too ([Note: the output a recomputed unit hands over])."""
        u = self.units[i]
        if not self.ckpt(i):
            return u.activation_bytes
        handed = i + 1 < self.n and not self.ckpt(i + 1)
        return u.input_bytes + (self.units[i + 1].handed_over_bytes() if handed else 0)

    def lead_bytes(self, i: int) -> int:
        """Activations of unit i live when its last module starts (`lead_activation_bytes`)."""
        u = self.units[i]
        return u.checkpointed_lead_bytes if self.ckpt(i) else u.lead_activation_bytes

    def forward_bytes(self, i: int) -> int:
        """Activations and transients of unit i's own at the peak of its forward."""
        u = self.units[i]
        if u.layers == ("",):  # the root's own forward is the code before the first layer;
            return u.activation_bytes + u.root_forward_bytes  # its workspace is its backward tail (profile.workspace)
        if self.ckpt(i):  # layer k runs saving nothing, next to the inputs layers 0..k-1 keep
            if not u.layer_bytes:  # and its own input, below its window ([Note: forward windows])
                return u.input_bytes + u.workspace_bytes // 2
            best, before = 0, 0
            for b in u.layer_bytes:
                best = max(best, before + b.inp + b.ck_produced + b.held + b.code)
                before += b.kept
            return best
        return u.forward_peak()

    def backward_start(self, i: int) -> int:
        """Activations and workspace of unit i's own as its backward starts, next to the
        previous unit's ReduceScatter input: all its activations and its workspace, or,
        checkpointed, its last layer recomputed (`UnitCost.checkpointed_start`)."""
        u = self.units[i]
        return u.checkpointed_start() if self.ckpt(i) and u.layer_bytes else u.backward_peak()

    def with_inputs_kept_before(self) -> "Scenario":
        """Each recomputed unit after another, its first layer's input retained by that unit:
        saved there, or, recomputing too, kept as an input both take ([Note: an input the unit
        before keeps])."""
        return replace(self, units=tuple(u.kept_before(shared=bool(self.ckpt(i - 1))) if i and self.ckpt(i) else u
                                         for i, u in enumerate(self.units)))

    def fused(self, i: int) -> bool:
        """Unit i holds several modules with per-layer bytes: FSDP2 runs its backward module
        by module (`UnitCost.inner_moments`)."""
        u = self.units[i]
        return len(u.layers) > 1 and bool(u.layer_bytes)

    def reduce_bytes(self, i: int) -> list[int]:
        """Each of unit i's layers' ReduceScatter input, padded to its strategy's shard count."""
        return self.units[i].layer_reduce_bytes(shard_count(self.strategies[i], self.cluster), self.state.reduce)

    def reduce_extra_bytes(self, i: int) -> list[int]:
        """Each of unit i's layers' reduce beyond its input and gradients (`UnitCost.reduce_extra_bytes`)."""
        return self.units[i].reduce_extra_bytes(shard_count(self.strategies[i], self.cluster), self.state.reduce,
                                                self.state.unsharded_grad)

    def done_bytes(self, i: int) -> list[int]:
        """Per layer of unit i: the sharded gradients of the layers after it."""
        return self.units[i].done_grad_bytes(shard_count(self.strategies[i], self.cluster), self.state.grad)

    def backward_seconds(self, i: int) -> float:
        """A checkpointed unit recomputes its forward (selective: some of it) inside its backward."""
        u = self.units[i]
        return u.backward_seconds + (u.recompute() if self.ckpt(i) else 0.0)

    @property
    def tied_unit(self) -> int:
        """The unit whose backward makes the root's tied gradient (`UnitCost.tied_at`); without
        one, the last ([Note: where the root's tied gradient appears] in profile/trace.py)."""
        return next((i for i, u in enumerate(self.units) if u.tied_at is not None), self.n - 1)

    @property
    def n(self) -> int:
        return len(self.units)

    def f_step(self, i: int) -> int:
        return i

    def b_step(self, i: int) -> int:
        return 2 * self.n - 1 - i

    def step_name(self, s: int) -> str:
        n = self.n
        if s < n:
            return f"F:{self.units[s].name}"
        if s < 2 * n:
            return f"B:{self.units[2 * n - 1 - s].name}"
        return "opt"

    def validate(self) -> None:
        """Raise ValueError when a launch point is outside its window."""
        n = self.n
        for i, s in enumerate(self.strategies):
            if not 0 <= self.forward_launch[i] <= i:
                raise ValueError(f"{self.units[i].name}: forward launch {self.forward_launch[i]} not in [0, {i}]")
            bl = self.backward_launch[i]
            if s.gathers_for_backward:
                if bl is None or not n <= bl <= self.b_step(i):
                    raise ValueError(f"{self.units[i].name}: backward launch {bl} not in [{n}, {self.b_step(i)}]")
            elif bl is not None:
                raise ValueError(f"{self.units[i].name}: {s.value} has no backward AllGather")


def default_launch(strategies: tuple[Strategy, ...], *, ahead: int = 1) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """FSDP2's default schedule: every AllGather `ahead` units before its use
    (explicit forward prefetch of the next unit, implicit backward prefetch)."""
    n = len(strategies)
    fwd = tuple(max(0, i - ahead) for i in range(n))
    bwd = tuple(max(n, 2 * n - 1 - i - ahead) if s.gathers_for_backward else None
                for i, s in enumerate(strategies))
    return fwd, bwd
