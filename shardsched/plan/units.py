"""Grouping layers into units (tensor fusion) and summing their costs.

[Note: fusion by block size]
An AllGather of M bytes costs alpha*steps + M/bw; below the block size
(`cost.comm.block_size_bytes`, ~90% of bandwidth) latency dominates, so small
consecutive layers are fused into one unit until the unit reaches the block size.
Layers are fused only when they get the same strategy (one `fully_shard` call
has one strategy).

[Note: the root unit]
The layer "" (profile/layers.py: parameters no layer owns, tied sets spanning
layers) is `fully_shard(model)` itself, applied last. It is never fused with other
layers, and FSDP2 never reshards the root after forward (`FSDPState._lazy_init`
clears the root's post-forward mesh: its parameters would be gathered again at once
for backward), so a full_shard or full_shard_node root runs as shard_grad_op, a
hybrid_shard root as hybrid_shard_grad_op, and is planned as such. The root is never
checkpointed: its forward is the whole model's, which checkpointing it would recompute.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from shardsched.core.types import Checkpoint, Strategy
from shardsched.plan.kept import (kept_in_unit, kept_when_checkpointed, own_inputs, recompute_live, recomputed_bytes,
                                  shared_input, unsaved_input)
from shardsched.profile.types import LayerProfile, Profile
from shardsched.sim.unit_cost import UnitCost


ROOT = ""


def root_strategy(strategy: Strategy) -> Strategy:
    """What the root unit runs as (see [Note: the root unit])."""
    if strategy in (Strategy.FULL_SHARD, Strategy.FULL_SHARD_NODE):
        return Strategy.SHARD_GRAD_OP
    return Strategy.HYBRID_SHARD_GRAD_OP if strategy is Strategy.HYBRID_SHARD else strategy


def layer_strategies(profile: Profile, strategies: list[Strategy]) -> list[Strategy]:
    """Per-layer strategies with the root's replaced by `root_strategy`."""
    return [root_strategy(s) if layer.name == ROOT else s for layer, s in zip(profile.layers, strategies)]


def _holder(name: str, units: list[tuple[str, ...]]) -> int | None:
    """Index of the unit whose layer contains parameter `name`; None = the root."""
    for i, layers in enumerate(units):
        if any(layer != ROOT and name.startswith(layer + ".") for layer in layers):
            return i
    return None


def tied_violation(units: list[tuple[str, ...]], tied: tuple[tuple[str, ...], ...]) -> str | None:
    """One line naming a tied set the units split, or None. FSDP2 refuses a tensor
    managed by two groups ("shared with a parameter already managed by another FSDP group")."""
    for names in tied:
        holders = {_holder(n, units) for n in names}
        if len(holders) > 1:
            where = ", ".join(sorted("the root" if h is None else repr(unit_name(units[h])) for h in holders))
            return (f"plan splits the tied parameters {', '.join(names)} across units {where}; accepted: a plan "
                    f"that keeps each tied set in one unit or in the root (make one with 'shardsched plan')")
    return None


def unit_name(layers: tuple[str, ...]) -> str:
    return layers[0] if len(layers) == 1 else f"{layers[0]}..{layers[-1]}"


def workspace_bytes(layers: list[LayerProfile]) -> int:
    """Transient bytes while a unit computes: its layers run one at a time, so the
    largest layer workspace (gradients of its largest saved tensors, materialised
    next to the activations during backward)."""
    return max(((layer.workspace_bytes or layer.activation_bytes // 2)
                + (layer.outside_workspace_bytes if k + 1 < len(layers) else 0) for k, layer in enumerate(layers)),
               default=0)


def unit_dims(layers: list[LayerProfile]) -> tuple[tuple[int, int], ...]:
    """Every parameter's (dim 0, numel); () when a layer with parameters lacks them."""
    if any(layer.params and not layer.dims for layer in layers):
        return ()
    return tuple(d for layer in layers for d in layer.dims)


# [Note: selective checkpointing as kept bytes]
# A selective layer (`Checkpoint.SELECTIVE`, core/sac_policy.py) keeps what a checkpointed one
# keeps (its inputs, what outside code saved) plus the outputs of the ops the policy saves
# (`LayerProfile.selective_saved_bytes`). Its backward recomputes the other ops: the cached
# outputs are handed back, not allocated again (torch/utils/checkpoint.py,
# `_CachedTorchDispatchMode` pops them), so when it is recomputed it holds what autograd
# saves, as a recomputed checkpointed layer does. So every moment of a selective unit is the
# checkpointed unit's with `kept` grown by the saved outputs: `unit_cost(..., SELECTIVE)`
# builds that cost, the scenario marks the unit checkpointed, and the simulator, the MILP
# rows and greedy's evaluator read it unchanged. Its forward peak is measured so
# (`LayerProfile.selective_forward_bytes`); unknown, the transient of a forward that saves
# nothing plus all its saved outputs is the bound taken. Its recomputation costs the recomputed ops' seconds
# (`UnitCost.recompute_seconds`), not the whole forward.

def as_policy(layer: LayerProfile, mode: Checkpoint) -> LayerProfile:
    """The layer with its selective fields those of `mode`'s policy (`LayerProfile.selective_all`
    under `+sac-all`), so the selective formulas read one set."""
    if mode is not Checkpoint.SELECTIVE_ALL or not layer.selective_all:
        return layer
    saved, outside, fwd, rec = layer.selective_all
    return dataclasses.replace(layer, selective_saved_bytes=int(saved), selective_outside_input_bytes=int(outside),
                               selective_forward_bytes=int(fwd), selective_recompute_seconds=float(rec))


def kept_when_selective(layer: LayerProfile) -> int:
    """A selective layer's inputs, outside code's saved bytes, and the policy's saved outputs
    (unknown: all its activations next to its inputs, an upper bound)."""
    saved = layer.activation_bytes if layer.selective_saved_bytes is None else layer.selective_saved_bytes
    return kept_when_checkpointed(layer) + saved


# [Note: an input an earlier layer's policy stores]
# A selective layer's output that its policy stores (a Linear's mm) is the next layer's input,
# which that layer's checkpoint keeps: one storage, counted in both layers' kept bytes (a GNN's
# input Linear before its message passing, fused under full_shard+sac: +4.7%). Inside a
# selective unit the later layer's kept input, and its recomputation moment, are taken net of
# it (`LayerProfile.selective_input_stored_bytes`, `_stored_in_redo`); a unit's first layer
# keeps its own, the earlier layer being another unit's, whose policy may not be this one; and
# only the layer just before counts (what an earlier one stored, another unit's or a shared
# input `kept_in_unit` takes off already, would be taken off twice). A
# stored output the later layer's own code saves (a BatchNorm after its conv) is its activation
# and not the producer's saved output (`_shared_output` in profile/trace.py): the trace leaves
# it out of both, or a ResNet's stem under shard_grad_op+sac was 8.7% under.

def _as_selective(layer: LayerProfile, stored: int = 0) -> LayerProfile:
    """The layer as its selective form reads through the checkpointed formulas: the saved
    outputs are inputs it keeps, on top of the forward transient too; `stored`: of its inputs,
    what the layer before it in the unit stores already."""
    extra = kept_when_selective(layer) - kept_when_checkpointed(layer)
    nosave = layer.checkpointed_forward_bytes or (layer.workspace_bytes or layer.activation_bytes // 2) // 2
    return dataclasses.replace(layer, input_bytes=layer.input_bytes + extra - stored,
                               checkpointed_forward_bytes=layer.selective_forward_bytes or nosave + extra)


# [Note: checkpointed units, layer by layer]
# `parallelize` checkpoints each layer of a unit on its own (composable `checkpoint`
# per module), not the unit as one block. So in forward a checkpointed unit's layers
# keep their inputs, and in backward they are recomputed one at a time, last first:
# when layer k is recomputed, the layers after it are done and the layers before it
# still hold their inputs. FSDP2 (torch 2.13) runs a fused unit's post-backward at each
# of its modules, so the layers after k have already reduced their gradients; the last
# ReduceScatter input (layer k+1's) is the one retained (FSDPMemTracker: "Sharded Grad"
# grows module by module, "Reduce Scatter" holds one module's gradients). That
# post-backward also reshards the unit, so every module after the first (in backward)
# gathers the whole unit again, shard_grad_op included: its copy-out holds the AllGather
# output and the unsharded parameters next to that ReduceScatter input and the
# activations of layers 0..k (`UnitCost.inner_moments`; swiglu-3x256, one unit of 5
# layers, shard_grad_op+ckpt: 10.5% under without it). Counting the
# whole unit's activations at once over-counted by all but one layer (GPT, 4 blocks at
# seq 1024 in 2 units: +38% at the peak; bench/bench_long_seq_memory.py).

# [Note: repeated modules]
# A module applied several times in one forward (ALBERT's one shared layer run once per
# depth; a block reused in a loop) is one layer with `calls` > 1: one set of parameters,
# gathered and reduced once per use of its unit, one workspace (its calls run backward one
# after the other), and activations and inputs summed over its calls (the profilers record
# every call). Checkpointed (PyTorch checkpoints each call on its own), every call keeps its
# inputs and backward recomputes one call at a time: the calls not being recomputed hold
# their inputs, the one being recomputed its activations (`recomputed_bytes`). Counting all
# calls' activations at once over-predicted a twice-applied block by 26%.
# Its children are not offered as units (the profilers leave `children` empty): their calls
# interleave (ln1, attn, mlp, ln1, attn, ...), which a chain of units, each run once in
# order, cannot express (a Transformer block run three times, split into its children, ran
# 11% above its prediction).

# [Note: a repeated module's later calls]
# FSDP2 (torch 2.13) runs a module's pre- and post-backward at every call: the post-backward
# after its last call's backward reshards it (shard_grad_op too), so the backward of each
# earlier call gathers it again. Its copy-out holds the AllGather output and the unsharded
# parameters next to the activations of the calls not yet done, the gradient of the call's
# output, and the gradient the done calls produced: autograd keeps it in the input buffer of
# the parameter's one AccumulateGrad, run after its first call's backward (FSDPMemTracker:
# "Temp" grows by the module's parameters). As the call computes, its workspace is that of
# the later calls' windows (`LayerProfile.recall_workspace_bytes`): the first call's window
# holds the gradient it produces, a later call's adds each parameter's share into that
# buffer as it comes. Adding the whole gradient on top of the workspace instead was 6-8%
# over on twice-applied blocks (DDP, full_shard). A block applied three times under shard_grad_op
# ran 4.2% above its prediction, and over its budget, without this moment
# (`UnitCost.recall_bytes`, a moment in `sim.memory`, a row in the MILP).

class LayerBytes(NamedTuple):
    """What the moments inside a unit read of each of its layers (`sim.scenario.UnitCost`)."""
    kept: int          # kept when checkpointed (inputs, outside code's saved bytes)
    act: int           # saved activations
    ws: int            # backward workspace
    params: int        # of its parameters, those that get a gradient ([Note: frozen parameters])
    redo: int          # live while one call is recomputed
    produced: int      # forward transient on top of its saved activations
    ck_produced: int   # checkpointed: forward transient on top of its kept inputs
    inp: int = 0       # its (one call's) inputs: live when it starts, checkpointed or not
    out: int = 0       # its output: the gradient its backward receives is this size
    calls: int = 1     # forward calls ([Note: repeated modules])
    recall_ws: int = 0  # a repeated layer's later calls' workspace (`LayerProfile.recall_workspace_bytes`)
    bws: int = 0       # its workspace on DDP (`LayerProfile.bucketed_workspace_bytes`); 0 = unknown
    held: int = 0      # checkpointed: the unit's earlier layers' outputs the calling code holds as it starts
    outside: int = 0   # a layer before the unit's last: what the code after it saved (`outside_bytes`)
    ows: int = 0       # ... and that code's backward workspace (`outside_workspace_bytes`)
    code: int = 0      # held by the calling code as it starts, beyond its unit's first layer's (`code_held_bytes`)
    flight: int = 0    # gradients in flight beside it as its backward starts (`flight_bytes`)
    posts: bool = True  # FSDP2 runs its post-backward (`LayerProfile.input_needs_grad`)

    def backward_own(self, window: int, flight: int = 0) -> int:
        """Its activations and `window` (its workspace, or its DDP one) as its backward runs, the
        code after it included beside the gradients in flight as the next layer's backward began
        (`flight`; [Note: the code between a fused unit's layers])."""
        if not self.outside:
            return self.act + window
        return self.act + max(window - self.outside, self.ows + flight)


# [Note: the code between a fused unit's layers]
# Inside a fused unit, the code after a layer other than the last (a GELU between Linear layers,
# a tied LM's loss and head before a wrapper's auxiliary head) runs its backward after the next
# layer's: FSDP2's post-backward of that module has resharded the whole unit (and launched its
# ReduceScatter), and the layer's own pre-backward has not gathered it again. So that code's
# backward holds all it saved and its workspace with none of the unit's unsharded parameters
# (the ("code", k) moment of `UnitCost.inner_moments`, `Inner.resharded`), and frees what it saved
# before the layer's own window opens (`profile.workspace_terms.layer_workspace`). Charged inside
# the window, a fused Mixer was 2.9% over its verified peak; charged with the unit gathered, a
# wrapped GPT-2 whose LM loss ran between `ln_f` and an auxiliary head 5.7%. On DDP nothing is
# gathered: `backward_own` is the larger of the two.


def layer_bytes(layers: list[LayerProfile]) -> tuple[LayerBytes, ...]:
    """(kept when checkpointed, activations, workspace, parameters, bytes live while it is
    recomputed, forward transient) per layer. The outside code of a layer other than the
    unit's last runs its backward inside the unit's backward, between the next layer's and
    this one's, next to the same activations: the layer's workspace is the larger of the two
    (counted as their sum, a fused U-Net whose SiLU, pooling and concatenation run between
    layers was 12.6% over its verified peak); the last layer's is a moment of its own
    (`UnitCost.outside_workspace_bytes`).
    In forward, the tensor being produced next to what is saved: its measured forward window,
    or half its backward workspace; a layer before the unit's last, the code after it as its exit
    window measured it, or half that code's backward workspace (two such tensors)."""
    out = []
    for k, layer in enumerate(layers):
        # the unit's earlier layers' outputs the calling code holds ([Note: outputs the caller's
        # code holds] in profile/held.py): live as it starts when the unit recomputes
        held = held_in_unit(layers, k)
        ws = layer.workspace_bytes or layer.activation_bytes // 2
        ows = layer.outside_workspace_bytes
        inner = k + 1 < len(layers)  # the last layer's outside code runs after the unit reshards
        produced, ck_produced = forward_transients(layer, ws)
        # the code after it, as measured ([Note: exit windows]: a residual add holds the sum and
        # the branch it adds; half its backward workspace where that is more), less what the
        # calling code held as it started, counted beside its moments already (`code`)
        produced = max(produced, max(ows // 2, layer.exit_bytes - layer.code_held_bytes) if inner else 0)
        redo = max(recomputed_bytes(layer), recompute_live(layer) - ws) - shared_input(layers, k)
        out.append(LayerBytes(kept_in_unit(layers, k), layer.activation_bytes, ws,
                              layer.params - layer.frozen_params - layer.unused_params, redo, produced,
                              max(ck_produced, produced),
                              own_inputs(layer) // max(1, layer.calls), layer.output_bytes, max(1, layer.calls),
                              layer.recall_workspace_bytes or ws, layer.bucketed_workspace_bytes or ws, held,
                              layer.outside_bytes if inner else 0, ows if inner else 0,
                              max(0, layer.code_held_bytes - layers[0].code_held_bytes), layer.flight_bytes,
                              layer.input_needs_grad))
    return tuple(out)


def _stored_input(layer: LayerProfile, mode: Checkpoint) -> int:
    """[Note: an input an earlier layer's policy stores]: of one call's input (a repeated layer's
    later calls take other tensors), what the layer before it stores under `mode`'s policy."""
    t = layer.selective_input_stored_bytes
    return t[held_index(mode) - 1] if t and layer.calls <= 1 else 0


def _stored_in_redo(layer: LayerProfile, b: LayerBytes, stored: int) -> int:
    """Of a selective layer's recomputation moment (`LayerBytes.redo`), its input an earlier
    layer's policy stores ([Note: an input an earlier layer's policy stores]), where the moment
    is what the layer saves and keeps. Where its measured recomputation peak stands for it
    (`recompute_live`: a GRU's per-step outputs) that input is left in: torch's selective
    cache (`_CachedTorchDispatchMode`) holds the stored outputs from the recomputation's start,
    until it reaches their ops, which a full recomputation's peak does not count (a pointer
    network's GRU, fused under full_shard+sac: -3.2% with it, -6.5% without)."""
    if not stored or recompute_live(layer) - b.ws > recomputed_bytes(layer):
        return 0
    return min(stored, layer.input_saved_before_bytes + unsaved_input(layer))


def held_index(mode: Checkpoint) -> int:
    """Where a `code_held` tuple holds the bytes for a producer checkpointed under `mode`."""
    return {Checkpoint.SELECTIVE: 1, Checkpoint.SELECTIVE_ALL: 2}.get(mode, 0)


def held_as(t: tuple, index: int) -> int:
    """`t[index]`; an older profile's pair has no `+sac-all` entry: its selective one."""
    return t[min(index, len(t) - 1)]


def held_in_unit(layers: list[LayerProfile], k: int, *, mode: Checkpoint = Checkpoint.FULL) -> int:
    """The outputs of the unit's layers before k that the calling code holds as layer k starts,
    when the unit recomputes (fully, or selectively: what its policy keeps is not extra)."""
    return sum(held_as(layers[k].code_held.get(j.name, (0, 0, 0)), held_index(mode)) for j in layers[:k])


def exit_net_of_held(layers: list[LayerProfile]) -> int:
    """Its last layer's `exit_bytes` less what the calling code holds that the unit's forward
    moments count already (`code_held_bytes`, added to each of them, the exit's too): measured, the
    exit window holds it as well (a Perceiver's `kv` held through its head: per layer under
    shard_grad_op +6.5% without this)."""
    return max(0, layers[-1].exit_bytes - min(layers[0].code_held_bytes, layers[-1].code_held_bytes))


def code_held_of(layers: list[LayerProfile]) -> tuple[dict[str, tuple[int, int, int]], int]:
    """(`UnitCost.code_held`, `code_held_bytes`): per layer before the unit, the most any of
    its layers' forwards sees held of that layer's outputs (an upper bound of the most at one
    moment), and what is held whatever recomputes as its first layer starts (a later layer's
    more is its own moments': `LayerBytes.code`; the logits a wrapper's `out` holds beside its
    auxiliary head, counted at the whole fused unit's forward, were 11% over)."""
    names = {layer.name for layer in layers}
    per: dict[str, tuple[int, int, int]] = {}
    for k, layer in enumerate(layers):
        for name, t in layer.code_held.items():
            if name not in names:  # the first layer's entries as they are: one below 0 nets off
                # what its `code_held_bytes` holds ([Note: an output only selective checkpointing saves])
                old = per.get(name, (0, 0, 0) if k else (-1 << 62,) * 3)
                per[name] = tuple(max(old[i], held_as(t, i)) for i in range(3))
    return per, layers[0].code_held_bytes if layers else 0


def forward_transients(layer: LayerProfile, ws: int) -> tuple[int, int]:
    """(on top of its saved activations, and checkpointed: on top of its kept inputs) the most
    its forward holds: from its measured forward windows ([Note: forward windows] in
    profile/workspace.py; a checkpointed forward saves nothing, so it is measured so), or
    half its backward workspace when they were not measured."""
    fallback = ws // 2
    own = layer.activation_bytes - layer.outside_bytes  # its outside code saves after it
    # The window's base holds its input that nothing saved yet (`entry_bytes`): live beside
    # what it saves, though it does not raise the window ([Note: forward windows]).
    plain = max(0, layer.forward_peak_bytes + layer.entry_bytes - own // max(1, layer.calls)) \
        if layer.forward_peak_bytes else fallback
    return plain, layer.checkpointed_forward_bytes or fallback


def _trainable_dims(layer: LayerProfile) -> tuple[tuple[int, int], ...]:
    """Its `dims` that get a gradient: none of a layer wholly frozen or unused, all of a partly
    frozen one (an upper bound: which of its parameters are frozen is not recorded)."""
    return () if layer.params and layer.frozen_params + layer.unused_params == layer.params else layer.dims


def unit_cost(layers: list[LayerProfile], mode: Checkpoint = Checkpoint.NONE) -> UnitCost:
    """The unit's cost; selective: its selective form ([Note: selective checkpointing as kept bytes])."""
    if mode.selective:
        layers = [as_policy(layer, mode) for layer in layers]
        recompute = sum(layer.forward_seconds if layer.selective_recompute_seconds is None
                        else layer.selective_recompute_seconds for layer in layers)
        stored = [0, *(_stored_input(layer, mode) for layer in layers[1:])]
        cost = unit_cost([_as_selective(layer, s) for layer, s in zip(layers, stored)])
        # the last layer's input when its module gathers again: its input, not its saved outputs
        last_extra = cost.layer_bytes[-1].kept - kept_when_checkpointed(layers[-1]) if len(layers) > 1 else 0
        # a layer's input live as it starts is its input, not the outputs its selective form keeps
        # ... and the outputs the calling code holds are what its policy does not keep
        # ... and what an earlier layer stores of it is not recomputed beside it again
        cost = dataclasses.replace(cost, layer_bytes=tuple(
            b._replace(inp=own_inputs(layer) // max(1, layer.calls), held=held_in_unit(layers, k, mode=mode),
                       redo=b.redo - _stored_in_redo(layer, b, s))
            for k, (b, layer, s) in enumerate(zip(cost.layer_bytes, layers, stored))))
        last = len(layers) - 1
        held = held_in_unit(layers, last, mode=mode) - held_in_unit(layers, last)
        # what its policy keeps of the outputs the caller holds past the unit's end (a Perceiver's
        # kv): in the exit window, measured without it ([Note: an output only selective checkpointing saves])
        kept_held = sum(max(0, -held_as(t, held_index(mode))) for name, t in layers[-1].code_held.items()
                        if name in {layer.name for layer in layers[:-1]})
        return dataclasses.replace(cost, recompute_seconds=recompute, selective=True, outside_input_bytes=(
            layers[-1].selective_outside_input_bytes if cost.outside_workspace_bytes else 0),
                                   exit_kept_bytes=kept_held,
                                   checkpointed_lead_bytes=cost.checkpointed_lead_bytes - last_extra + held)
    names = tuple(layer.name for layer in layers)
    last_input = own_inputs(layers[-1]) if len(layers) > 1 else 0
    # [Note: outputs code after a later layer saves] in profile/held.py: held as the last module starts
    last_code = max(0, layers[-1].code_held_bytes - layers[0].code_held_bytes) + (
        layers[-1].held_to_save_bytes if len(layers) > 1 else 0)
    return UnitCost(name=unit_name(names), layers=names, dims=unit_dims(layers),
                    params=sum(layer.params for layer in layers),
                    frozen_params=sum(layer.frozen_params for layer in layers),
                    unused_params=sum(layer.unused_params for layer in layers),
                    forward_seconds=sum(layer.forward_seconds for layer in layers),
                    backward_seconds=sum(layer.backward_seconds for layer in layers),
                    forward_ops=sum(layer.forward_ops for layer in layers),
                    activation_bytes=sum(layer.activation_bytes for layer in layers),
                    # live when its last module gathers again (`sim.memory`): what the others
                    # saved, and the last one's input
                    # (of its input, what the others saved is in their activations already: a
                    # CNN's head after a ReLU was 3.6% over counting it again)
                    lead_activation_bytes=sum(layer.activation_bytes for layer in layers[:-1]) + (
                        layers[-1].entry_bytes if layers[-1].input_saved_bytes is not None and len(layers) > 1
                        else last_input) + _later_call(layers, checkpointed=False) + last_code,
                    checkpointed_lead_bytes=sum(kept_in_unit(layers, k) for k in range(len(layers) - 1)) + last_input
                    - shared_input(layers, len(layers) - 1)
                    + held_in_unit(layers, len(layers) - 1) + _later_call(layers, checkpointed=True) + last_code,
                    workspace_bytes=workspace_bytes(layers),
                    outside_workspace_bytes=layers[-1].outside_workspace_bytes,
                    outside_activation_bytes=layers[-1].outside_bytes if layers[-1].outside_workspace_bytes else 0,
                    input_bytes=sum(kept_in_unit(layers, k) for k in range(len(layers))),
                    entry_bytes=layers[0].entry_bytes + layers[0].held_to_save_bytes,
                    held_to_save_bytes=layers[0].held_to_save_bytes, exit_bytes=exit_net_of_held(layers),
                    lead_saved_before_bytes=layers[0].input_saved_before_bytes if layers[0].calls <= 1 else 0,
                    lead_shared_bytes=(min(layers[0].input_shared_bytes, own_inputs(layers[0]))
                                       if layers[0].calls <= 1 else 0),
                    lead_resaved_bytes=layers[0].input_resaved_bytes if layers[0].calls <= 1 else None,
                    **dict(zip(("code_held", "code_held_bytes"), code_held_of(layers))),
                    layer_bytes=layer_bytes(layers),
                    tied_at=next((k for k, layer in enumerate(layers) if layer.makes_tied_grad), None),
                    root_forward_bytes=layers[0].forward_peak_bytes if names == (ROOT,) else 0,
                    layer_dims=tuple(_trainable_dims(layer) for layer in layers) if all(
                        layer.dims or not layer.params for layer in layers) else ())


# [Note: a repeated layer's later forward calls]
# A unit of one layer that its model calls more than once (a block applied twice) under a
# strategy that reshards after forward gathers again at each later call, while FSDP2 still
# holds the earlier call's AllGather output ([Note: the held AllGather output] in
# sim/memory.py): as a fused unit's later module (`sim.memory.extra_gather`), two AllGather
# outputs of the unit beside what the earlier calls saved and the later call's input
# (FSDPMemTracker, an LM whose one block runs twice, full_shard+ckpt at world 64: 13.6% under
# without that moment, its auto plan over its budget).


def _later_call(layers: list[LayerProfile], *, checkpointed: bool) -> int:
    """`UnitCost.lead_activation_bytes` (`checkpointed`: `checkpointed_lead_bytes`) of a unit of
    one repeated layer, 0 otherwise: its earlier calls' share of what it saves (checkpointed:
    keeps) and its last call's input ([Note: a repeated layer's later forward calls])."""
    if len(layers) != 1 or layers[0].calls <= 1:
        return 0
    layer, calls = layers[0], layers[0].calls
    if checkpointed:  # every call's kept input: the earlier ones' and the last one's
        return kept_when_checkpointed(layer)
    return layer.activation_bytes - layer.activation_bytes // calls + own_inputs(layer) // calls


# [Note: the parent's own code in a partition]
# A layer split into its children (`blocks.3.attn`, `head.out`: units of their own) also runs
# code of its own between and after them: a head's cross-entropy after its projection, a GNN
# layer's scatter and concatenation between its message and update children. FSDP2 wraps only
# the children, so that code runs after the child before it has resharded and runs its backward
# before that child's pre-backward gathers it: it is that child's outside code, exactly as code
# between layers is the layer's before it. The profilers fold it so (`outside_bytes`,
# `outside_workspace_bytes` of the child; `profile.trace`, `profile.measure`, the analytic
# head); charged to the last child instead, a split LM head lost its loss's backward (-9% on
# a 6-layer GPT, -23% on its least-memory plan, whose advised budget was then refused). What
# runs before the first child is left to the last one (`partition`).


def _with_incoming(child: LayerProfile, incoming: int) -> LayerProfile:
    """A child whose outside code (its parent's, after it) also holds, in its backward, the
    gradient it receives: that of the next child's inputs, or of the parent's output ([Note:
    the parent's own code in a partition]; a GNN layer's scatter between its children: -10%
    without it)."""
    if not child.outside_workspace_bytes:
        return child
    return dataclasses.replace(child, outside_workspace_bytes=child.outside_workspace_bytes + incoming)


def partition(layer: LayerProfile) -> list[LayerProfile]:
    """A split layer's children as units take them: each child's outside code (the parent's code
    after it, folded in by the profilers) holding the gradient it receives, and the last child
    absorbing the rest of the parent (its code before the first child, its own parameters and
    seconds), so the partition costs what the layer does."""
    kids = [_with_incoming(c, nxt.input_bytes) for c, nxt in zip(layer.children, layer.children[1:])]
    kids.append(_with_incoming(layer.children[-1], layer.output_bytes))
    last = kids[-1]
    residual = layer.activation_bytes - sum(c.activation_bytes for c in kids)
    kids[-1] = dataclasses.replace(
        last, params=last.params + layer.params - sum(c.params for c in kids),
        frozen_params=last.frozen_params + layer.frozen_params - sum(c.frozen_params for c in kids),
        unused_params=last.unused_params + layer.unused_params - sum(c.unused_params for c in kids),
        forward_seconds=last.forward_seconds + layer.forward_seconds - sum(c.forward_seconds for c in kids),
        backward_seconds=last.backward_seconds + layer.backward_seconds - sum(c.backward_seconds for c in kids),
        forward_ops=last.forward_ops + max(0, layer.forward_ops - sum(c.forward_ops for c in kids)),
        activation_bytes=last.activation_bytes + residual,
        # its exit window spans the parent's code after it ([Note: exit windows]); the loss after
        # the parent is after it too
        exit_bytes=max(last.exit_bytes, layer.exit_bytes),
        outside_workspace_bytes=max(last.outside_workspace_bytes, layer.outside_workspace_bytes),
        # the parent's own code runs outside the child: checkpointing the child keeps it
        outside_bytes=last.outside_bytes + max(0, residual), children=(),
        dims=last.dims if layer.params == sum(c.params for c in kids) else ())
    return kids


def group_layers(profile: Profile, strategies: list, *, block_params: int) -> list[list[int]]:
    """Consecutive layer indices per unit: fuse layers of the same strategy (and
    checkpointing, when `strategies` holds (strategy, checkpointed) pairs) while
    the unit is below `block_params` parameters (0 disables fusion)."""
    groups: list[list[int]] = []
    for i, layer in enumerate(profile.layers):
        root = layer.name == ROOT or (groups and profile.layers[groups[-1][-1]].name == ROOT)
        if (groups and not root and block_params > 0 and strategies[groups[-1][-1]] == strategies[i]
                and sum(profile.layers[j].params for j in groups[-1]) < block_params):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
