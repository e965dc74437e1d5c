"""Per-worker memory at every compute step of a schedule, as FSDP2 allocates it.

Each step is evaluated at the moments where FSDP2's live set is largest
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
- copy-out: `wait_for_unshard` copies the AllGather output into the unsharded
  parameters, so both exist; in forward the previous unit's AllGather output is
  still held ([Note: Overlapping all-gather copy-in and all-gather], the
  `all_gather_state`) until this copy-out ends;
- compute: unsharded parameters, launched-but-unused AllGather buffers
  (prefetches), retained activations and the unit's workspace; in backward
  also the previous unit's ReduceScatter input (one is retained,
  `reduce_scatter_max_input_buffers` = 1), and at the end of the unit's
  backward its unsharded gradients, its own activations by then freed;
- reduce: after `reshard`, the unsharded gradients are copied into the
  ReduceScatter input (both live), the previous input having been reclaimed.
The optimizer step holds all sharded gradients plus its own temporaries.

Node-aware strategies and checkpointing (`cost.strategy`, [Note: the node-aware
strategies]): a unit holds `held_after_forward` bytes between its forward and its
backward (its whole gathered copy when it does not reshard, a node-sized slice for
full_shard_node, which is still live at its backward copy-out); a checkpointed unit
retains only its inputs, and its backward starts by recomputing the forward, so at
its backward its full activations are live again.

[Note: plans that run on DDP]
An all-replicate fp32 plan runs on DDP (`runtime/ddp.py`, `gradient_as_bucket_view`):
parameters are plain tensors and the gradients live in DDP's buckets, allocated once
(parameter-sized) and all-reduced in place. So every step holds the parameters plus one
parameter-sized bucket (counted as the unsharded copy), and gather and reduction buffers
add nothing (FSDPMemTracker/MemTracker: ViT one unit, fp32, the FSDP2 model over-predicted
by 5.6%, counting the unit's gradients next to its copy). Autograd hands DDP each
parameter's gradient as it is produced, and DDP copies it into the bucket and frees it: a
layer's gradients are live at the end of its own backward only (as FSDP2's layer by layer,
less the reduction), except a tied tensor's (a tied embedding and LM head): autograd
sums its two uses first, so the head's gradient waits through all of backward, as the
root's gradients do under FSDP2 (`Profile.root_tied_numel`; an LM with a 32k vocabulary
was 14% under without it).
The MILP rows and the greedy evaluator's twin count this one choice as FSDP2's
replicate (an upper bound at every moment); auto's uniform baselines are simulated,
so the DDP plan is still found (`solve.baselines`). Its optimizer step is the trainer's
foreach step, as FSDP2's (see `_optimizer`).
"""
from __future__ import annotations

import dataclasses
from itertools import accumulate
from typing import NamedTuple

from shardsched.cost.strategy import all_reduces, held_after_forward, shard_count
from shardsched.core.types import GradSync, MemoryBreakdown, Strategy
from shardsched.sim.scenario import Scenario
from shardsched.sim.unit_cost import outside_backward_bytes


def forward_gathers(unit, strategy: Strategy) -> int:
    """AllGather outputs a unit holds while it runs forward: none for replicate (a shard
    group of one copies in place), else one."""
    return 0 if strategy is Strategy.REPLICATE else 1


def extra_gather(unit, strategy: Strategy) -> int:
    """1 for a unit of several modules that reshards after forward (full_shard,
    full_shard_node, hybrid_shard): FSDP2 (torch 2.13) runs the group's pre-forward at
    each module and reshards after each, so a later module gathers again while the
    unit's previous AllGather output is still held. Measured with FSDPMemTracker (GPT 1
    unit of 4 modules; BERT, Qwen2, GPT-2, T5 behind a root unit; BERT with
    full_shard_node and hybrid_shard): two AllGather outputs of the unit, with the
    activations of its earlier modules (`lead_activation_bytes`). So does a unit of one layer
    called more than once, at its later calls ([Note: a repeated layer's later forward calls]
    in plan/units.py)."""
    return 1 if strategy.gathers_for_backward and (len(unit.layers) > 1 or unit.repeats) else 0


# [Note: the held AllGather output]
# FSDP2 keeps a unit's forward AllGather output until the next unit's copy-out
# (`FSDPParamGroup.wait_for_unshard`, [Note: Overlapping all-gather copy-in and all-gather]),
# where FSDPMemTracker sees it next to the new unit's AllGather output and unsharded
# parameters. A replicate unit (a shard group of one) runs that copy-out too, so the output
# is freed there and does not live on through replicate units (torch 2.13; passing it on was
# 3.5% over on a Mixer whose head followed a replicate norm).


def root_grad_bytes(sc: Scenario) -> int:
    """Unsharded gradients of the root unit (layer "") live through all of backward: its tied
    tensors' (`Profile.root_tied_numel`: a tied head's weight gradient appears as backward
    starts and waits for the embedding's), the root reducing last. Its other parameters (an
    untied embedding) get theirs only at its own backward, the last step (`ugrad[0]`):
    charging all of them throughout was 5% over on an untied LM at world 2, leaving the tied
    head's out of the first backward step 8% under on a tied one."""
    return sc.root_tied_numel * sc.state.unsharded_grad if sc.n and sc.units[0].layers == ("",) else 0


def holds_root_grad(i: int, tied: int, *, outside: bool = False) -> bool:
    """At the backward of unit i: the root's tied gradients exist (`root_grad_bytes`) from the
    backward of unit `tied` on (`Scenario.tied_unit`, the last where the head follows the last
    layer), but not yet while the loss after it runs its backward (`outside`), before the
    head's; inside that unit, `UnitCost.tied_late` and `Inner.tied` say when."""
    return 0 < i < (tied if outside else tied + 1)


# [Note: the loss before the unit's backward]
# Code outside every layer that runs after a unit's last layer (the loss; a tied LM head
# whose weight the root unit holds) runs its forward after FSDP2's post-forward resharded the
# unit (a full_shard unit holds only its AllGather output, kept until the next copy-out, with
# the logits-sized tensor it produces: half its backward workspace), and its backward first, before the gradient reaches
# the unit's output: FSDP2's pre-backward has not gathered the unit yet (a full_shard unit
# holds nothing then, a shard_grad_op one its kept copy) nor launched its backward
# prefetches. So its transient (cross-entropy's two (T, vocab) gradients) sits next to all
# retained activations but not next to the unit's gathered parameters and prefetches, as
# charging it to the unit's own backward did (+7% on an LM at world 64; the issue saw +7..29%
# on causal LMs at realistic vocabularies).


# [Note: frozen parameters]
# A parameter with `requires_grad=False` (a sinusoidal position table, a frozen backbone) is
# stored, sharded and gathered like any other, but autograd gives it no gradient: FSDP2 reduces
# only the parameters with one (`foreach_reduce` over `fsdp_params_with_grad`), DDP buckets only
# those, and AdamW creates state only for a parameter whose `.grad` is set. So a unit's
# gradients, ReduceScatter buffers and optimizer state count its trainable part
# (`UnitCost.trainable`, in proportion within a unit; per layer, `LayerBytes.params` and
# `UnitCost.layer_dims` leave a wholly frozen layer out); its parameters and AllGathers count
# all of it. A frozen trunk under a trained head (tests/verify/user_models.py `build_frozen`)
# was +379% on DDP, +52% under shard_grad_op; within 1.5% now. The MILP rows and greedy's
# evaluator read the same per-layer figures but count a unit's sharded gradients and
# optimizer state over all its parameters: an upper bound while searching; the plan's
# prediction is this simulator's.

# [Note: accumulation memory]
# Under gradient accumulation (`runtime.accum`) the memory of one step is that of its worst
# micro-batch; from the second on, the gradients of the earlier ones live through the whole
# forward and backward (torch 2.13, _fully_shard/_fsdp_param_group.py `post_backward`):
# - GradSync.EVERY: each unit's sharded gradient (reduce-scattered and accumulated in place
#   in `sharded_param.grad`), of the units not yet reduced in this micro-batch (those reduced
#   already are counted by `sharded_grads`);
# - GradSync.LAST (`reduce_grads` False): FSDP2 reduces nothing and keeps every parameter's
#   unsharded gradient: in the reduce dtype (fp32, `FSDPParam.unsharded_accumulated_grad`,
#   upcast from bf16 after each backward) or, when there is none, in `unsharded_param.grad`,
#   where autograd accumulates in place. Unpadded: gradients as autograd produces them. A
#   middle micro-batch holds them all (the last has reduced the units behind it, a shard
#   each, never more). Accumulating 2 there is none: in a unit's backward the first holds the
#   gradients of the units behind it (nothing reduced, no shard), the last those of the units
#   not yet reduced (a Mixer accumulating 2 under full_shard+ckpt was 3.3% over with them all).
# A plan on DDP reducing every micro-batch accumulates in its buckets, already counted whole;
# under `no_sync` (GradSync.LAST) autograd accumulates in each parameter's `.grad` beside the
# bucket, which DDP fills only at the last micro-batch (a CNN accumulating 2: 6.7% under
# without them).


def own_grad_bytes(unit, sc: Scenario) -> int:
    """The unsharded gradients a unit's backward adds at its end: its parameters'. Where
    accumulation keeps them unsharded in their own dtype (GradSync.LAST, no separate reduce
    dtype) autograd adds each new gradient into `unsharded_param.grad` in place, so beyond what
    `accumulation_bytes` holds there is one parameter's at a time, its largest ([Note:
    accumulation memory]; a Mixer accumulating 3 micro-batches was 4.3% over counting both)."""
    if sc.accumulates_in_place:
        return max((numel for _, numel in unit.dims), default=unit.params) * sc.state.unsharded_grad
    return unit.trainable(unit.params) * sc.state.unsharded_grad


def reduce_moment_bytes(unit, n: int, *, reduce: int, grad: int, own_grad: int) -> int:
    """Bytes a unit's largest reduce holds beside its unsharded gradients (`own_grad`, counted
    apart): the ReduceScatter input as the gradients are copied in; then `foreach_reduce` drops
    the gradients and allocates the output, 1/n of the input, while FSDPMemTracker's wrapper of
    `post_backward` still holds the last parameter's gradient (its loop variable): whichever is
    more. A 4 MB embedding's reduce at world 4 holds 5 MB and the gradient: a two-tower model
    whose peak is that moment ([Note: a unit whose inputs need no gradient] in
    runtime/own_backward.py) was predicted 4.9% under with the input alone. The simulator, the
    MILP and greedy read this one figure."""
    rs = unit.module_reduce_numel(n, last=False)
    last = unit.dims[-1][1] if unit.dims else 0
    return rs * reduce + max(0, rs // n * reduce + last * grad - own_grad)


def in_place_reduce_bytes(unit, rs: list[int], shard_bytes: int, reduce: int) -> tuple[int, int]:
    """Accumulating in place (`Scenario.accumulates_in_place`), what a fused unit's inner moments
    hold beyond the unsharded gradients `accumulation_bytes` counts whole, as (at its first
    module's reduce, what the reduce frees and leaves beyond its input: `in_place_held`). Before
    the last micro-batch nothing is reduced (0); in it every parameter of the unit has a gradient
    at its first module's post-backward, so FSDP2 reduces the whole unit there (its ReduceScatter
    input padded, next to the unsharded gradients it copies), then holds that input and the
    unit's shards, its unsharded gradients freed (FSDPMemTracker on a fused CNN accumulating 3:
    5% under with per-layer inputs). Each later module's post-backward reduces only the gradient
    its backward just made (`FSDPParamGroup.post_backward`: the accumulated ones are gone), and
    the whole input goes with that reduce: from then on the layer's own input is held (a fused
    Mixer under replicate accumulating 2 was 7.9% over with the whole one held to the end)."""
    return sum(rs), shard_bytes - unit.params * reduce


def in_place_held(whole: int, freed: int, m, last: int, rs: list[int]) -> int:
    """`in_place_reduce_bytes` of inner moment m (`UnitCost.inner_moments`) of a unit whose first
    module to reduce is layer `last` (`UnitCost.first_reduce`: its last layer, unless that runs
    no post-backward) and whose layers' ReduceScatter inputs are `rs`: the whole input is held
    until the next module reduces, its own after that."""
    if m.reducing == last:
        return whole if m.done == last else max(0, whole + freed)
    return rs[m.reducing] + freed


def accumulation_bytes(sc: Scenario, live: "_Live", s: int) -> int:
    """Gradients of earlier micro-batches live at forward/backward step s, beyond what the
    step's moments count ([Note: accumulation memory]); 0 without accumulation."""
    if sc.accumulation <= 1 or s >= 2 * sc.n:
        return 0
    trainable = sum(u.trainable(u.params) for u in sc.units)
    if live.ddp:  # under `no_sync` autograd accumulates in `.grad`, beside the bucket
        return trainable * sc.state.unsharded_grad if sc.grad_sync is GradSync.LAST else 0
    if sc.grad_sync is GradSync.EVERY:
        return sum(live.tshard) * sc.state.grad - live.sharded_grads(s) + live.all_reduce_held(s)
    if sc.accumulation == 2 and s >= sc.n:  # no middle micro-batch: the first's or the last's
        ended = sum(u.trainable(u.params) for u in sc.units[2 * sc.n - s:]) * sc.state.reduce
        return max(0, ended - live.sharded_grads(s), trainable * sc.state.reduce - ended)
    return max(0, trainable * sc.state.reduce - live.sharded_grads(s))


class StepMemory(NamedTuple):
    step: int
    name: str
    breakdown: MemoryBreakdown

    @property
    def total(self) -> int:
        return self.breakdown.total


class _Live:
    """Byte counts of one scenario, precomputed per unit."""

    def __init__(self, sc: Scenario):
        sb, cl = sc.state, sc.cluster
        self.sc = sc
        n = [shard_count(s, cl) for s in sc.strategies]
        # FSDP2 pads every parameter's dim 0 to a multiple of the strategy's shard count
        # (`cost.strategy.shard_count`: world, the node for hybrid_*, 1 for replicate):
        # shards, AllGather outputs (and the unsharded views into them) and ReduceScatter
        # inputs are padded; gradients as autograd produces them are not. full_shard_node's
        # node-sized slice is 1/g of the world-padded copy (`held_after_forward`).
        self.shard = [u.shard_numel(k) for u, k in zip(sc.units, n)]
        self.tshard = [u.trainable(s) for u, s in zip(sc.units, self.shard)]  # [Note: frozen parameters]
        self.unsharded = [u.padded_numel(k) * sb.unsharded_param for u, k in zip(sc.units, n)]
        self.held = [held_after_forward(s, b, cl) for s, b in zip(sc.strategies, self.unsharded)]
        self.retained = [sc.retained_bytes(i) for i in range(sc.n)]
        self.ugrad = [own_grad_bytes(u, sc) for u in sc.units]
        self.rsbuf = [reduce_moment_bytes(u, k, reduce=sb.reduce, grad=sb.unsharded_grad, own_grad=g)
                      for u, k, g in zip(sc.units, n, self.ugrad)]
        # what stays retained after a unit's backward: its last-reduced module's input
        self.rs_kept = [u.module_reduce_numel(k, last=True) * sb.reduce for u, k in zip(sc.units, n)]
        # A replicate unit is a shard group of one: FSDP2 copies its shards straight into
        # the unsharded parameters (`FSDPParamGroup.unshard` / `wait_for_unshard`,
        # `world_size == 1`): no AllGather output exists and none is held over.
        # [Note: the held AllGather output]: each unit's forward output is held until the next copy-out.
        self.agbuf = [forward_gathers(u, s) * b for u, s, b in zip(sc.units, sc.strategies, self.unsharded)]
        self.root_grad = root_grad_bytes(sc)
        # Launched-but-unused AllGathers (prefetches) are counted at the world's padding
        # for every strategy, as the MILP counts them (linear in its launch variables);
        # for hybrid_* (padded to the node) this is an upper bound.
        self.pend = [u.padded_numel(cl.world) * sb.unsharded_param for u in sc.units]
        self.persist_params = sum(self.shard) * sb.param
        self.persist_opt = sum(self.tshard) * sb.optimizer
        self.ddp = sc.on_ddp  # [Note: plans that run on DDP]
        if self.ddp:
            zero = [0] * sc.n
            # the bucket: `unsharded_live` counts it; DDP buckets only parameters with a gradient
            self.unsharded = [u.trainable(b, bucket=True) for u, b in zip(sc.units, self.unsharded)]
            self.rsbuf, self.agbuf, self.pend, self.rs_kept = zero, zero, zero, zero
            # only a tied tensor's gradient waits (for its second use) outside the bucket; the
            # others leave for it as they are accumulated ([Note: bucketed windows])
            self.root_grad = sc.root_tied_numel * sb.unsharded_grad if sc.units[0].layers == ("",) else 0
            self.ugrad = [0] * sc.n
            if self.root_grad or sc.units[0].layers == ("",):
                self.ugrad[0] = self.root_grad
        self._per_step()

    def _per_step(self) -> None:
        """`unsharded_live`, `pending_gathers` and `sharded_grads` at every step, summed once
        over the units by difference arrays (each is read at every moment of every step)."""
        sc, steps = self.sc, 2 * self.sc.n + 2  # the optimizer step reads 2n + 1
        unsh, pend, here = [0] * (steps + 1), [0] * (steps + 1), [0] * steps
        for i in range(sc.n):
            f, b = sc.f_step(i), sc.b_step(i)
            unsh[f + 1] += self.held[i]  # f < s < b: held after forward
            unsh[b] -= self.held[i]
            if sc.strategies[i] is Strategy.REPLICATE:
                continue
            for launch, use in ((sc.forward_launch[i], f), (sc.backward_launch[i], b)):
                if launch is not None and launch < use:  # launch < s < use; at s == launch if launched here
                    pend[launch + 1] += self.pend[i]
                    pend[use] -= self.pend[i]
                    if launch >= 0:
                        here[launch] += self.pend[i]
        self._unsh, self._pend, self._here = list(accumulate(unsh[:steps])), list(accumulate(pend[:steps])), here
        for i in range(sc.n):  # at a unit's own steps, its whole copy
            self._unsh[sc.f_step(i)] += self.unsharded[i]
            self._unsh[sc.b_step(i)] += self.unsharded[i]
        # reduced before step s: the units whose backward step is below s (unit i's is 2n - 1 - i)
        # on DDP the bucket, unused parameters' slots too ([Note: parameters a step never uses])
        slots = [u.trainable(k, bucket=True) for u, k in zip(sc.units, self.shard)] if self.ddp else self.tshard
        done = [slots[2 * sc.n - 1 - s] if sc.n <= s < 2 * sc.n else 0 for s in range(steps)]
        self._grads = [0, *accumulate(done)][:steps]

    def unsharded_live(self, s: int, *, exclude: int = -1) -> int:
        """Parameters gathered (or held after forward) and not yet freed at step s;
        at a unit's own forward and backward steps its whole unsharded copy."""
        sc = self.sc
        if self.ddp:  # the bucket, holding the gradients, all step long
            return sum(self.unsharded)
        total = self._unsh[s]
        if 0 <= exclude < sc.n:
            f, b = sc.f_step(exclude), sc.b_step(exclude)
            total -= self.unsharded[exclude] if s in (f, b) else self.held[exclude] if f < s < b else 0
        return total

    def pending_gathers(self, s: int, *, include_launched_here: bool) -> int:
        """AllGather outputs launched but not yet copied out at step s (none of a replicate
        unit: [Note: a shard group of one issues no AllGather] in sim/timeline.py)."""
        return self._pend[s] + (self._here[s] if include_launched_here else 0)

    def sharded_grads(self, s: int) -> int:
        """Reduced gradients of units whose backward ended before step s."""
        sc = self.sc
        if self.ddp and s < 2 * sc.n:  # in the bucket until the optimizer step
            return 0
        return self._grads[s] * sc.state.grad

    def all_reduce_held(self, s: int) -> int:
        """The reduce outputs of all-reducing units whose backward ended before step s: FSDP2
        keeps each (`FSDPParamGroup._all_reduce_state`) until the unit's next post-backward or the
        end of backward. Beside gradients already held (a later micro-batch, reducing every one)
        they are extra bytes (a CNN alternating full_shard and replicate, accumulating 3: 6.5%
        under without them); in the first they are the gradients."""
        sc = self.sc
        return sum(self.tshard[j] for j in range(sc.n)
                   if sc.b_step(j) < s and all_reduces(sc.strategies[j])) * sc.state.reduce

    def activations(self, upto: int) -> int:
        """Retained activations of units 0..upto."""
        return sum(self.retained[: upto + 1])

    def inner(self, i: int) -> list[tuple[int, int, int, int, int, bool]]:
        """(own, ReduceScatter input, sharded gradients, AllGather output, unsharded parameters
        freed) bytes, and whether the root's tied gradient may exist (`Inner.tied`), of each
        moment inside fused unit i's backward after its last layer's end
        (`UnitCost.inner_moments`); on DDP the gradients go to the bucket as produced: no
        reduction input, none sharded, nothing gathered or freed."""
        sc = self.sc
        moments = sc.units[i].inner_moments(sc.state.unsharded_grad, checkpointed=sc.ckpt(i),
                                            in_place=sc.accumulates_in_place).values()
        if self.ddp:
            return [(m.own, 0, 0, 0, 0, m.tied) for m in moments if not m.gathered]
        rs, done = sc.reduce_bytes(i), sc.done_bytes(i)
        if sc.accumulates_sharded and not all_reduces(sc.strategies[i]):  # in the gradients `accumulation_bytes` holds
            done = [0] * len(done)
        ag = lambda m: self.agbuf[i] if m.gathered else 0  # noqa: E731
        freed = lambda m: self.unsharded[i] if m.resharded else 0  # noqa: E731
        if sc.accumulates_in_place:
            held = in_place_reduce_bytes(sc.units[i], rs, self.shard[i] * sc.state.grad, sc.state.reduce)
            last = sc.units[i].first_reduce()
            return [(m.own, in_place_held(*held, m, last, rs), 0, ag(m), freed(m), m.tied) for m in moments]
        extra = sc.reduce_extra_bytes(i)
        return [(m.own, rs[m.reducing] + (extra[m.reducing] if m.output else 0), done[m.done], ag(m), freed(m), m.tied)
                for m in moments]


def step_memory(sc: Scenario) -> list[StepMemory]:
    """The peak moment of every compute step 0..2n."""
    live, out = _Live(sc), []
    for s in range(2 * sc.n + 1):
        moments = _forward(live, s) if s < sc.n else _backward(live, s) if s < 2 * sc.n else [_optimizer(live)]
        held = accumulation_bytes(sc, live, s)
        moments = [dataclasses.replace(m, grads=m.grads + held) for m in moments] if held else moments
        out.append(StepMemory(s, sc.step_name(s), max(moments, key=lambda m: m.total)))
    return out


def _mb(live: _Live, *, unsharded=0, grads=0, act=0, comm=0, opt_extra=0) -> MemoryBreakdown:
    return MemoryBreakdown(params=live.persist_params + unsharded + live.sc.buffer_bytes, grads=grads,
                           optimizer=live.persist_opt + opt_extra + live.sc.optimizer_scalar_bytes,
                           activations=act + live.sc.input_bytes + live.sc.loss_bytes, comm_buffers=comm)


def _forward(live: _Live, i: int) -> list[MemoryBreakdown]:
    code = live.sc.code_held_bytes(i)  # earlier outputs the calling code holds ([Note: outputs the caller's code holds])
    return [dataclasses.replace(m, activations=m.activations + code) for m in _forward_moments(live, i)] \
        if code else _forward_moments(live, i)


def _forward_moments(live: _Live, i: int) -> list[MemoryBreakdown]:
    sc, s = live.sc, i
    held_prev = live.agbuf[i - 1] if i > 0 else 0
    # the whole input, unless the unit before retains it ([Note: the output a recomputed unit hands over])
    entry = sc.units[i].entry_after_checkpointed() if i and sc.ckpt(i - 1) and sc.ckpt(i) else sc.units[i].entry_bytes
    copyout = _mb(live, unsharded=live.unsharded_live(s), act=live.activations(i - 1) + entry,
                  comm=held_prev + live.agbuf[i] + live.pending_gathers(s, include_launched_here=False))
    # Forward transients: the tensor being produced next to what is saved, about the
    # largest saved one (half the backward workspace, which is two of them).
    compute = _mb(live, unsharded=live.unsharded_live(s), act=live.activations(i - 1) + sc.forward_bytes(i),
                  comm=live.agbuf[i] + live.pending_gathers(s, include_launched_here=True))
    moments = [copyout, compute]
    after = sc.units[i].after_forward()
    if after:  # the code after it ([Note: exit windows]; the loss: [Note: the loss before the
        # unit's backward], in forward), after the unit reshards, its AllGather output held
        held = live.unsharded_live(s) if live.ddp else live.unsharded_live(s, exclude=i) + live.held[i]
        moments.append(_mb(live, unsharded=held, act=live.activations(i) + after,
                           comm=live.agbuf[i] + live.pending_gathers(s, include_launched_here=True)))
    if len(sc.units[i].layers) > 1 or sc.units[i].repeats:  # (a repeated layer's later call, too)
        # Its last module starts with the others' activations and its input live. Units
        # that reshard after forward gather again there while the unit's first AllGather
        # output is still the held one (the previous unit's was freed at the first
        # copy-out); the prefetches launched at the unit's first module are in flight.
        extra = extra_gather(sc.units[i], sc.strategies[i])
        moments.append(_mb(live, unsharded=live.unsharded_live(s), act=live.activations(i - 1) + sc.lead_bytes(i),
                           comm=(1 + extra) * live.agbuf[i]
                           + live.pending_gathers(s, include_launched_here=True)))
    return moments


def _backward(live: _Live, s: int) -> list[MemoryBreakdown]:
    sc = live.sc
    i = 2 * sc.n - 1 - s
    u = sc.units[i]
    # [Note: where the root's tied gradient appears] in profile/trace.py
    root = live.root_grad if holds_root_grad(i, sc.tied_unit) else 0
    grads = live.sharded_grads(s) + (0 if u.tied_late else root)
    held_rs = live.rs_kept[i + 1] if i + 1 < sc.n else 0
    pending = live.pending_gathers(s, include_launched_here=True)
    act, unsharded = live.activations(i - 1), live.unsharded_live(s)
    # Backward frees the unit's activations as it produces its gradients: at the
    # start all activations are live, at the end all gradients; the workspace
    # (gradients of the largest activations) is live throughout.
    moments = []
    if live.ddp and u.tied_late:  # (DDP plans recompute nothing)
        own, after = u.bucketed_peaks()
        moments.append(_mb(live, unsharded=unsharded, grads=grads + root, act=act + after, comm=held_rs + pending))
    else:
        own = u.bucketed_peak() if live.ddp else sc.backward_start(i)
    moments.append(_mb(live, unsharded=unsharded, grads=grads, act=act + own, comm=held_rs + pending))
    if not sc.fused(i):
        moments += [_mb(live, unsharded=unsharded, grads=grads + live.ugrad[i],
                        # on DDP only the root's tail (the tied embedding's backward) ends beside a gradient
                        act=act + (0 if live.ddp and sc.units[i].layers != ("",) else sc.units[i].workspace_bytes),
                        comm=held_rs + pending),
                    _mb(live, unsharded=live.unsharded_live(s, exclude=i), grads=grads + live.ugrad[i],
                        act=act, comm=live.rsbuf[i] + pending)]
    elif not live.ddp:  # module by module; the unit stays gathered until its last module's backward
        # (on DDP no module holds its gradients and its windows are the bucketed ones: each
        # such moment is one of `bucketed_peak`'s; counted with FSDP2's windows, a DDP plan of
        # a fused nn.TransformerEncoderLayer stack was 3.2% over)
        last = sc.units[i].last_end(sc.state.unsharded_grad, checkpointed=sc.ckpt(i), in_place=sc.accumulates_in_place)
        moments.append(_mb(live, unsharded=unsharded, grads=grads, act=act + last, comm=held_rs + pending))
        moments += [_mb(live, unsharded=unsharded - freed, grads=live.sharded_grads(s) + (root if tied else 0) + done,
                        act=act + own, comm=rs + ag + pending)
                    for own, rs, done, ag, freed, tied in live.inner(i)]
    outside = outside_backward_bytes(sc.units, i)
    if outside:  # [Note: the loss before the unit's backward]
        held = live.unsharded_live(s) if live.ddp else live.unsharded_live(s, exclude=i) + live.held[i]
        root = live.root_grad if holds_root_grad(i, sc.tied_unit, outside=True) else 0
        moments.append(_mb(live, unsharded=held, grads=live.sharded_grads(s) + root, act=live.activations(i) + outside,
                           comm=held_rs + live.pending_gathers(s, include_launched_here=False)))
    if sc.strategies[i].gathers_for_backward:  # copy-out of its backward AllGather
        moments.append(_mb(live, unsharded=live.unsharded_live(s) + live.held[i], grads=grads,
                           # before any recomputation; the gradient of its output has arrived
                           act=live.activations(i) + sc.units[i].grad_in_bytes(),
                           comm=held_rs + live.unsharded[i] + live.pending_gathers(s, include_launched_here=False)))
    for gathered in (True, False):  # a repeated layer's earlier call ([Note: a repeated module's later calls])
        recall = sc.units[i].recall_bytes(sc.state.unsharded_grad, checkpointed=sc.ckpt(i), gathered=gathered,
                                              inner=not live.ddp)
        if recall:  # (on DDP too: autograd holds the accumulated gradient; nothing is gathered)
            moments.append(_mb(live, unsharded=unsharded, grads=grads, act=act + recall,
                               comm=held_rs + (live.agbuf[i] if gathered else 0) + pending))
    return moments


def _optimizer(live: _Live) -> MemoryBreakdown:
    # The trainer's optimizer steps with foreach kernels ([Note: the optimizer verified is the
    # trainer's] in verify/optimizer.py): one temporary list the size of the parameters it steps.
    sc = live.sc
    extra = int(sc.optimizer_workspace_factor * sum(live.tshard) * sc.state.param)
    return _mb(live, grads=live.sharded_grads(2 * sc.n + 1), opt_extra=extra)


def peak(sc: Scenario) -> StepMemory:
    return max(step_memory(sc), key=lambda m: m.total)
