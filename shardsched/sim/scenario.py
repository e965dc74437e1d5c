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

from dataclasses import dataclass

from shardsched.cost.device import Cluster
from shardsched.cost.memory import StateBytes, shard_numel
from shardsched.core.types import GradSync, Strategy


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    """The profile of one unit (the sum over its layers)."""

    name: str
    layers: tuple[str, ...]
    params: int
    forward_seconds: float
    backward_seconds: float
    activation_bytes: int
    """Retained from the unit's forward until its backward."""
    workspace_bytes: int = 0
    """Transient bytes while the unit computes (largest activation-gradient buffers)."""
    dims: tuple[tuple[int, int], ...] = ()
    """(dim-0 size, numel) per parameter, for FSDP2's dim-0 padding; () = unknown."""
    lead_activation_bytes: int = 0
    """Activations of all its layers but the last, and the last one's input: live when
    its last module starts."""
    input_bytes: int = 0
    """What it retains instead when checkpointed: its layers' forward inputs, and what
    code outside them saved (`LayerProfile.outside_bytes`: not recomputed)."""
    checkpointed_lead_bytes: int = 0
    """`lead_activation_bytes` when checkpointed: its other layers keep only their inputs."""
    layer_bytes: tuple = ()
    """Per layer, in forward order: (bytes kept when checkpointed, activations, workspace,
    parameters, bytes live while it is recomputed, forward transients: `plan.units.LayerBytes`), for the moments inside its backward ([Note: checkpointed units, layer
    by layer] in `plan.units`)."""

    outside_workspace_bytes: int = 0
    """Transient of the backward of code outside its last layer (a loss after it), which runs
    before FSDP2 gathers the unit for backward (`LayerProfile.outside_workspace_bytes`)."""
    outside_activation_bytes: int = 0
    """What that code saved (`LayerProfile.outside_bytes` of its last layer): its backward
    frees them before the unit's own backward starts."""
    layer_dims: tuple[tuple[tuple[int, int], ...], ...] = ()
    """`dims` per layer (for the per-module ReduceScatter inputs of a fused unit); () = unknown."""

    def module_reduce_numel(self, n: int, *, last: bool) -> int:
        """Elements of one module's ReduceScatter input over n shards: FSDP2 (torch 2.13)
        reduces a fused unit module by module ([Note: checkpointed units, layer by layer] in
        plan/units.py), so the input retained after the unit's backward is its first layer's
        (the last to run backward; `last=True`), and the largest its own reduce holds is its
        largest layer's. A unit of one layer, or without per-layer dims: the whole unit's."""
        if len(self.layers) < 2 or len(self.layer_dims) != len(self.layers):
            return self.padded_numel(n)
        sizes = [n * shard_numel(sum(d for _, d in dims), dims, n) if dims else 0 for dims in self.layer_dims]
        return sizes[0] if last else max(sizes)

    def checkpointed_backward(self, reduce_bytes: float) -> tuple[int, int]:
        """Its own bytes at the peak of its backward when checkpointed, as (at its last
        layer, the most at its other layers): layer k is recomputed while the layers
        before it keep their inputs; FSDP2 reduces each module's gradients as its backward
        ends, keeping the last ReduceScatter input (`reduce_bytes` per parameter of layer
        k+1) while layer k runs. At its last layer that input is the previous unit's (the
        simulator's)."""
        layers, before, last, inner = self.layer_bytes, 0, 0, 0
        for k, (kept, _, ws, _, redo, _, _) in enumerate(layers):
            if k + 1 < len(layers):
                inner = max(inner, int(before + redo + ws + layers[k + 1][3] * reduce_bytes))
            else:  # the loss after it already ran its backward, freeing what it saved
                last = before + redo - self.outside_activation_bytes + ws
            before += kept
        return last, inner

    def backward_peak(self) -> int:
        """Its own activations and workspace at the peak of its backward when not
        checkpointed: layers run backward last to first, and layer k's backward frees the
        activations of the layers after it, so the peak is the most over k of the
        activations of layers 0..k and layer k's workspace (not all activations next to
        the largest workspace: that over-counted a fused CNN by 24%). The last layer's
        outside code (the loss) ran its backward first, freeing what it saved."""
        if not self.layer_bytes:
            return self.activation_bytes + self.workspace_bytes
        return self._layer_by_layer(lambda b: b.ws)

    def forward_peak(self) -> int:
        """Its own activations and transients at the peak of its forward when not
        checkpointed: layer k produces its tensors (`LayerBytes.produced`, measured) next to
        the activations of layers 0..k. The last layer's outside code (the loss) has not
        saved yet: it runs after the unit reshards."""
        if not self.layer_bytes:
            return self.activation_bytes + self.workspace_bytes // 2
        return self._layer_by_layer(lambda b: b.produced)

    def _layer_by_layer(self, extra) -> int:
        """The most over k of the activations of layers 0..k and `extra` of layer k, the last
        layer's outside code's saved bytes not counted."""
        best, acts, last = 0, 0, len(self.layer_bytes) - 1
        for k, b in enumerate(self.layer_bytes):
            acts += b.act
            best = max(best, acts - (self.outside_activation_bytes if k == last else 0) + extra(b))
        return best

    def module_ends(self, grad_bytes: float, reduce_bytes: float, *, checkpointed: bool) -> tuple[
            tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
        """A unit of several modules, as FSDP2 reduces it module by module: its own (gradients,
        activations and workspace, reduction input) bytes at the end of its last layer's
        backward (the previous unit's ReduceScatter input held: the caller's), the most at the
        end of another layer's (layer k+1's input held), and the most at a module's reduce.
        Layer k's backward ends with its unsharded gradients and workspace next to the
        activations (kept bytes when checkpointed) of layers 0..k-1; charging the whole unit's
        gradients next to its largest workspace over-predicted fused HF decoders by 12-18%."""
        layers, before = self.layer_bytes, 0
        last = inner = red = (0, 0, 0)
        for k, (kept, act, ws, params, _, _, _) in enumerate(layers):
            g = int(params * grad_bytes)
            if k + 1 < len(layers):
                inner = max(inner, (g, before + ws, int(layers[k + 1][3] * reduce_bytes)), key=sum)
            else:
                last = (g, before + ws, 0)
            red = max(red, (g, before, int(params * reduce_bytes)), key=sum)
            before += kept if checkpointed else act
        return last, inner, red

    def backward_regather(self, reduce_bytes: float, *, checkpointed: bool) -> int:
        """Its own bytes at the copy-out of a later module's AllGather in its backward:
        the most over k < last of the activations of layers 0..k (their kept bytes when
        checkpointed: k not yet recomputed) and layer k+1's ReduceScatter input."""
        best, acts = 0, 0
        for k in range(len(self.layer_bytes) - 1):
            kept, act, _, _, _, _, _ = self.layer_bytes[k]
            acts += kept if checkpointed else act
            best = max(best, int(acts + self.layer_bytes[k + 1][3] * reduce_bytes))
        return best

    def shard_numel(self, n: int) -> int:
        """Elements per worker sharded n ways (dim 0 of each parameter padded)."""
        return shard_numel(self.params, self.dims, n)

    def padded_numel(self, n: int) -> int:
        """Elements of the AllGather output / ReduceScatter input over n shards; the
        unsharded parameters are views into the AllGather output, so they occupy this too."""
        return n * self.shard_numel(n)


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
    checkpoint: tuple[bool, ...] = ()
    """Per unit: activation checkpointing on (empty: off everywhere)."""
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

    def ckpt(self, i: int) -> bool:
        return bool(self.checkpoint) and self.checkpoint[i]

    def retained_bytes(self, i: int) -> int:
        """Activations unit i keeps from its forward to its backward."""
        u = self.units[i]
        return u.input_bytes if self.ckpt(i) else u.activation_bytes

    def lead_bytes(self, i: int) -> int:
        """Activations of unit i live when its last module starts (`lead_activation_bytes`)."""
        u = self.units[i]
        return u.checkpointed_lead_bytes if self.ckpt(i) else u.lead_activation_bytes

    def forward_bytes(self, i: int) -> int:
        """Activations and transients of unit i's own at the peak of its forward."""
        u = self.units[i]
        if u.layers == ("",):  # the root's own forward is the code before the first layer;
            return u.activation_bytes  # its workspace is its backward tail (profile.workspace)
        if self.ckpt(i):  # layer k runs saving nothing, next to the inputs layers 0..k-1 keep
            if not u.layer_bytes:
                return u.input_bytes + u.workspace_bytes // 2
            best, before = 0, 0
            for b in u.layer_bytes:
                best = max(best, before + b.ck_produced)
                before += b.kept
            return best
        return u.forward_peak()

    def backward_bytes(self, i: int) -> tuple[int, int]:
        """Activations and workspace of unit i's own as its backward starts, next to the
        previous unit's ReduceScatter input, and later in its backward (0: none larger):
        all its activations and its workspace, or, checkpointed, its layers recomputed
        one by one (`UnitCost.checkpointed_backward`)."""
        u = self.units[i]
        if not self.ckpt(i):
            return u.backward_peak(), 0
        return u.checkpointed_backward(self.state.reduce)

    def module_end_bytes(self, i: int):
        """`UnitCost.module_ends` of unit i (None for a unit of one layer)."""
        u = self.units[i]
        if len(u.layers) < 2 or not u.layer_bytes:
            return None
        return u.module_ends(self.state.unsharded_grad, self.state.reduce, checkpointed=self.ckpt(i))

    def regather_bytes(self, i: int) -> int:
        """Unit i's own bytes when a later module gathers again in its backward (0: one module)."""
        return self.units[i].backward_regather(self.state.reduce, checkpointed=self.ckpt(i))

    def backward_seconds(self, i: int) -> float:
        """A checkpointed unit recomputes its forward inside its backward."""
        u = self.units[i]
        return u.backward_seconds + (u.forward_seconds if self.ckpt(i) else 0.0)

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
