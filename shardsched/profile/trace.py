"""Traced profiles: exact bytes and FLOPs per layer on fake tensors, no memory, no noise.

The model's parameters and buffers are swapped for fake CPU tensors
(`FakeTensorMode`, `torch.func.functional_call`, ties preserved), one forward and
backward run, and every op is attributed to the layer (and child) running it:
- forward: module pre/post hooks keep a stack of running layers;
- backward: every autograd node a torch function creates in forward is tagged with
  its layer (`Node.metadata`), and backward ops read the tag of the node being
  evaluated (`torch._C._current_autograd_node`); untagged nodes (inside composite
  ops, AccumulateGrad) belong to the last tagged one;
- saved activations: `saved_tensors_hooks`, each storage once, parameters, buffers
  and example inputs excluded (they are persistent state or `Profile.input_bytes`);
- FLOPs: `FlopCounterMode`'s formulas per op class; ops with no formula are
  memory-bound and counted by the bytes they read and write.
Seconds = `DeviceSpec.compute_seconds(flops per class)` + moved bytes / memory
bandwidth. Same model, inputs and device -> the same profile, bit for bit.

Fake CPU tensors dispatch as CPU kernels do (SDPA's CPU flash kernel saves the
output and a logsumexp, not an s x s matrix), so activations match FSDP2 on CPU
exactly; GPU kernels may save slightly different tensors (e.g. fused RMSNorm).

Its parts: `trace_fake` (fake copies of model and inputs), `trace_record` (what is recorded per
layer), `trace_stacks` (repeated blocks traced once); this module runs it and makes the `Profile`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections import defaultdict
from typing import Any, Sequence

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.core.types import Checkpoint
from shardsched.cost.device import DeviceSpec
from shardsched.errors import UsageError
from shardsched.profile import layers as L
from shardsched.profile.escapes import Escapes, owners, settled_layers
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.types import LayerProfile, Profile
from shardsched.profile.held import HeldOutputs, code_held
from shardsched.profile.fake_rules import FakeRules as _FakeRules, cold_fake_mode
from shardsched.profile.workspace import ROOT_TAIL, BackwardWorkspace
from shardsched.profile.workspace_terms import layer_workspace, outside_workspace
from shardsched.profile.unused import no_gradient, unused_ids, unused_numel
from shardsched.core import sac_policy as sac
from shardsched.profile.trace_fake import (fake_copy_inputs, fake_parameters, fake_state, hf_one_sequence_per_row,
                                          loss_of, module_params, quiet_fake_tensor_log, real_copy_inputs, real_masks,
                                          real_state, restored, seeded, untied)
from shardsched.profile.trace_record import (FlopCounter, SacStats, Stats, Tagger, Tracer, loss_bytes,
                                             pinned_storage_keys, storage_bytes, storage_key)
from shardsched.profile.trace_stacks import (Truncated, expand, find_stacks, fold, fold_target, traced_source,
                                             untraced)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Untraceable(UsageError):
    """The model's code cannot run on fake tensors (a data-dependent op, `.item()`); the
    message names the op. `profile.resolve.profiled` then measures it for real."""


# [Note: what outside code saves again]
# A storage is counted once, at the code that saved it first. A conv block's ReLU saves its
# output, and the pooling after the block (code outside every layer: the model's own forward,
# a U-Net's encoder) saves the same tensor again: it is in the block's activations and nowhere
# else. When the block recomputes it saves nothing, but the pooling still holds its output until
# its own backward, so a checkpointed block keeps it beside its inputs
# (`LayerProfile.outside_kept_bytes`, read by `plan.kept.kept_when_checkpointed`). A U-Net
# checkpointed everywhere ran 9.6% above its prediction without it (its encoders' outputs).

@pinned_storage_keys()  # [Note: storage keys] in trace_record.py
def _run(model: nn.Module, inputs: tuple, names: list[str], children: dict, dtype: torch.dtype,
         real: bool = False) -> Tracer:
    """One traced step; `real`: on real copies of the model ([Note: a trace on real tensors])."""
    if real:
        mode, state, fake_inputs = contextlib.nullcontext(), real_state(model, dtype), real_copy_inputs(inputs, dtype)
    else:
        mode = cold_fake_mode(allow_non_fake_inputs=False)  # [Note: a cold fake-tensor cache]
        state, fake_inputs = fake_state(model, dtype, mode), fake_copy_inputs(inputs, dtype, mode)
    exclude = {storage_key(t) for t in [*state.values(), *L.tensors_in(fake_inputs)]}
    tracer = Tracer(model, names, children)
    tracer.saved_keys, tracer.persistent_keys = exclude, set(exclude)
    by_key = defaultdict(list)
    for n, t in state.items():
        by_key[storage_key(t)].append(n)
    tracer.tied_names = {k: tuple(ns) for k, ns in by_key.items() if len(ns) > 1}
    tracer.stats.itemsize = torch.empty((), dtype=dtype).element_size()
    ws = BackwardWorkspace(model, names, list(tracer.parent), persistent=[*state.values(), *L.tensors_in(fake_inputs)],
                           parents=tracer.parent, params=module_params(state, [*names, *tracer.parent]))
    kept: list[torch.Tensor] = []  # keep saved storages alive: no StorageImpl reuse while we dedupe
    rules = _FakeRules()
    # [Note: boolean masks on fake tensors] in trace_fake.py
    masks = contextlib.nullcontext() if real else real_masks(inputs, fake_inputs)
    # [Note: a parameter used outside its layer] in profile/escapes.py
    tracer.escapes = Escapes(owners(model, [*names, *tracer.parent], state), lambda: tracer.stack, tracer.parent)

    added: dict[int, tuple] = {}  # [Note: saves of a branch that dies in forward]
    alive: dict[int, int] = defaultdict(int)

    def pack(t: torch.Tensor) -> _Saved:
        k = storage_key(t)
        _resaved(tracer, k, t)
        tracer.stats.out_status.saved(k, first=k not in exclude, outside=tracer.outside(), layer=tracer.forward_key()[0])
        if k in exclude and tracer.outside():  # [Note: what outside code saves again]
            owner = tracer.stats.saved_inside.pop(k, None)
            if owner is not None:
                tracer.stats.outside_kept[owner] += t.untyped_storage().nbytes()
        if k not in exclude:
            exclude.add(k)
            own_input = []
            if not tracer.outside():
                tracer.stats.saved_inside[k] = tracer.forward_key()[0]
                for key in tracer.forward_key():  # its own input, saved by its own code
                    if k in tracer.stats.fresh_inputs.get(key, ()):
                        tracer.stats.input_saved[key] += t.untyped_storage().nbytes()
                        own_input.append(key)
            kept.append(t)
            nbytes = t.untyped_storage().nbytes()
            ws.note_saved(nbytes, t.untyped_storage())
            keys = tracer.forward_key()
            for key in keys:
                tracer.stats.acts[key] += nbytes
            st = tracer.stats
            _shared_output(st, k, keys, nbytes, outside=tracer.outside())
            st.largest_saved[keys[0]] = max(st.largest_saved[keys[0]], nbytes)
            kid = None
            if tracer.outside():
                st.outside[keys[0]] += nbytes
                st.outside_largest[keys[0]] = max(st.outside_largest[keys[0]], nbytes)
            elif (kid := tracer.after_child()) is not None:  # the parent's code: the child's outside code
                st.acts[kid] += nbytes
                st.outside[kid] += nbytes
                st.outside_largest[kid] = max(st.outside_largest[kid], nbytes)
            added[k] = (nbytes, keys, kid, tracer.outside(), tuple(own_input))
        return _Saved(t, k, alive)

    try:
        with restored(model), quiet_fake_tensor_log(), hf_one_sequence_per_row(), mode, masks, rules, FlopCounter(tracer), Tagger(tracer), ws, warnings.catch_warnings(), \
                fake_parameters(model, untied(state)), seeded(real):
            warnings.simplefilter("ignore")
            with torch.autograd.graph.saved_tensors_hooks(pack, _Saved.unpack), tracer.escapes:
                loss = loss_of(model(*fake_inputs))
            _unsave_dead(tracer.stats, added, alive)
            tracer.stats.loss_bytes = loss_bytes(loss)
            ws.backward_starts()  # the loss is computed: backward is not code between modules
            kept.clear()  # the graph holds what backward needs; activations must free as it runs
            tracer.stats.sac_forward = False
            loss.backward()
        tracer.stats.no_grad = frozenset() if real else no_gradient(state, ws.accumulated_ids)
    except UsageError:
        raise
    except Exception as e:  # data-dependent ops and the like: the model cannot be traced
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        op = f"op {rules.failed} failed " if rules.failed else ""
        raise Untraceable(f"cannot trace the model on {'real' if real else 'fake'} tensors: {op}({type(e).__name__}: {msg[:200]}); "
                          f"accepted: --measure to profile it on real tensors on this machine instead") from None
    finally:
        tracer.stats.workspace.update(ws.finish())
        tracer.stats.forward_peak.update(ws.forward)
        tracer.stats.recompute_peak.update(ws.recompute)
        tracer.stats.exit.update(ws.exit)
        tracer.stats.recall.update(ws.recall)
        tracer.stats.flight.update(ws.flight)
        tracer.stats.forward_top = ws.forward_top
        tracer.stats.bucketed.update(ws.bucketed)
        tracer.stats.loss_window.update(ws.loss_window)
        tracer.remove()
    with restored(model), quiet_fake_tensor_log(), hf_one_sequence_per_row(), mode, masks, rules, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for keep, out in ((None, tracer.stats.forward_nosave),
                          *((m, tracer.stats.sac[m].forward) for m in sac.MODES)):
            held = None if keep else HeldOutputs(model, names)  # [Note: outputs the caller's code holds]
            try:
                with seeded(real):
                    out.update(_forward_without_saving(model, state, fake_inputs, names, list(tracer.parent),
                                                       [*state.values(), *L.tensors_in(fake_inputs)], keep_saved=keep))
            finally:
                if held is not None:
                    held.remove()
                    tracer.stats.held = held
    return tracer


# [Note: saves of a branch that dies in forward]
# Autograd saves an op's inputs when the op runs, but a branch whose output never reaches the
# loss (a router's score read only by `score > 0`, an argmax) frees its nodes, and what they
# saved, as soon as that output goes: `Linear(d, 1)` saved its (B, T, d) input for an instant.
# The trace counted every first save as an activation of the running layer (a masked-MLP LM:
# 6.6% over its full_shard peak, one (B, T, d) a block). Autograd holds a `_Saved` per save;
# a storage none of whose holders lives when forward ends is taken back out of the layer's
# activations, its outside code's and its own-input bytes (`_unsave_dead`). The windows are
# left as measured: the trace keeps the tensor (no storage is reused while it dedupes), so
# they count it both in their peak and in what was saved. Kept, the tensor keeps its own
# producer alive: what a dead branch's earlier nodes saved (its LayerNorm's input) still
# counts, an upper bound (keeping the storage alone made a node's death, and so the profile,
# vary between runs).

class _Saved:
    """What autograd holds for one saved tensor; counts the storage's live holders."""

    __slots__ = ("t", "k", "alive")

    def __init__(self, t: torch.Tensor, k: int, alive: dict[int, int]):
        self.t, self.k, self.alive = t, k, alive
        alive[k] += 1

    def __del__(self):
        self.alive[self.k] -= 1

    @staticmethod
    def unpack(saved: "_Saved") -> torch.Tensor:
        return saved.t


def _unsave_dead(st: Stats, added: dict[int, tuple], alive: dict[int, int]) -> None:
    """Take the first saves no live node holds back out ([Note: saves of a branch that dies in forward])."""
    for k, (nbytes, keys, kid, outside, own_input) in added.items():
        if alive[k] > 0:
            continue
        for key in keys:
            st.acts[key] -= nbytes
        if outside:
            st.outside[keys[0]] -= nbytes
        if kid is not None:
            st.acts[kid] -= nbytes
            st.outside[kid] -= nbytes
        for key in own_input:
            st.input_saved[key] -= nbytes


class _KeepSaved(TorchDispatchMode):
    """Holds the outputs of the ops selective checkpointing stores under `mode`'s policy
    (`core.sac_policy.Policy`, its mm counter restarted at each layer's call) to the end of
    forward, as its caching mode does."""

    def __init__(self, mode, model: nn.Module, names: list[str]):
        super().__init__()
        self.kept: list = []
        self.policy = sac.Policy(mode)
        self.handles = [model.get_submodule(n).register_forward_pre_hook(lambda *_: self.policy.reset())
                        for n in names if n != L.ROOT]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.policy.saves(func):
            self.kept.append(out)
        return out

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return super().__exit__(*exc)


def _resaved(tracer: Tracer, k: int, t: torch.Tensor) -> None:
    """`LayerProfile.input_resaved_bytes`: the running layer (and child) saves again an input
    an earlier layer saved first (a conv after a ReLU), each storage once."""
    if tracer.outside():
        return
    st = tracer.stats
    for key in tracer.forward_key():
        if k in st.before_keys.get(key, ()):
            st.before_keys[key].discard(k)
            st.input_resaved[key] += t.untyped_storage().nbytes()


def _shared_output(st: Stats, k: int, keys: tuple, nbytes: int, *, outside: bool) -> None:
    """A storage selective checkpointing keeps for one key (its output: the stem's Linear) that
    code of another key saves for backward first (the next block's norm), or code outside every
    layer (a GELU between layers, folded into the producer): that key's saved tensors, kept
    inputs or `outside_bytes` count it in any plan, so the producer's selective layer does not
    count it again (`LayerProfile.selective_saved_bytes`; a Mixer: 11% over under `+sac`), nor
    does a later layer take it off its input (`SacStats.unstore`). Saved by outside code, it is
    no unsaved input of that code's forward either (its exit window does not count it), so it
    leaves `selective_outside_input_bytes` too (a VAE's MSE loss saving the decoder's output,
    under shard_grad_op+sac 3.0% under with it taken off the loss's transient)."""
    for sc in st.sac.values():
        for key in sc.seen.get(k) or ():
            if key not in keys or outside:
                sc.unstore(key, k, nbytes)
        if outside and k in sc.read_outside:  # counted there when that code read it
            for key in sc.seen.get(k) or ():
                sc.outside[key] -= nbytes
        if outside:
            sc.read_outside.add(k)  # and never counted there from now on


def _forward_without_saving(model: nn.Module, state: dict, inputs: tuple, names: list[str], children: list[str],
                            persistent: list, *, keep_saved=None) -> dict[str, int]:
    """Each layer's forward peak when it saves nothing, as a checkpointed layer's forward runs:
    the same forward under `no_grad`, watched by the live-bytes mode ([Note: forward windows] in
    profile/workspace.py); `keep_saved` (a selective mode): keeping what its policy stores."""
    ws = BackwardWorkspace(model, names, children, persistent=persistent)
    keep = _KeepSaved(keep_saved, model, names) if keep_saved else contextlib.nullcontext()
    try:
        with ws, torch.no_grad(), keep:
            torch.func.functional_call(model, untied(state), inputs, tie_weights=True)
    finally:
        ws.finish()
    return ws.forward


def _workspace(name: str, params: Sequence[nn.Parameter], st: Stats) -> int:
    """`LayerProfile.workspace_bytes`: the root's is its backward tail as measured (its base
    holds its gradients: [Note: the root's backward tail]); a layer's is its window above
    the model (a repeated module's: above the gradient its done calls accumulated, which
    `UnitCost.recall_bytes` counts)."""
    if name == L.ROOT:
        return max(st.workspace.get(ROOT_TAIL, 0), st.workspace.get(L.ROOT, 0))
    # what its outside code saved is freed by that code's backward before its window opens
    return layer_workspace(st.workspace.get(name, 0), st.acts.get(name, 0) - st.outside.get(name, 0),
                           sum(p.numel() for p in params) * st.itemsize)


def _layer(name: str, params: Sequence[nn.Parameter], st: Stats, device: DeviceSpec,
           kids: tuple = ()) -> LayerProfile:
    fwd, bwd = dict(st.flops["fwd"].get(name, {})), dict(st.flops["bwd"].get(name, {}))
    bw = device.memory_bandwidth
    return LayerProfile(
        name=name, params=sum(p.numel() for p in params), dims=L.dims(params),
        frozen_params=L.frozen_numel(params), unused_params=unused_numel(params, st.unused_ids),
        forward_seconds=device.compute_seconds(fwd) + st.moved["fwd"].get(name, 0) / bw,
        backward_seconds=device.compute_seconds(bwd) + st.moved["bwd"].get(name, 0) / bw,
        forward_ops=st.ops.get(name, 0),
        activation_bytes=st.acts.get(name, 0),
        workspace_bytes=_workspace(name, params, st),
        outside_workspace_bytes=outside_workspace(st.outside_largest.get(name, 0), st.loss_window.get(name, 0))
        if name != L.ROOT else 0,
        forward_peak_bytes=st.forward_peak.get(name, 0) if name != L.ROOT else 0,
        recompute_peak_bytes=st.recompute_peak.get(name, 0) if name != L.ROOT else 0,
        checkpointed_forward_bytes=st.forward_nosave.get(name, 0) if name != L.ROOT else 0,
        exit_bytes=st.exit.get(name, 0) if name != L.ROOT else 0, output_bytes=st.output.get(name, 0),
        recall_workspace_bytes=st.recall.get(name, 0) if st.calls.get(name, 1) > 1 else 0,
        flight_bytes=st.flight.get(name, 0) if name != L.ROOT else 0,
        bucketed_workspace_bytes=st.bucketed.get(name, 0) if name != L.ROOT else 0,
        **dict(zip(("selective_saved_bytes", "selective_outside_input_bytes", "selective_forward_bytes",
                    "selective_recompute_seconds"), _selective(name, st.sac[Checkpoint.SELECTIVE], device))),
        selective_all=_selective(name, st.sac[Checkpoint.SELECTIVE_ALL], device),
        selective_input_stored_bytes=tuple(st.sac[m].input_stored.get(name, 0) for m in sac.MODES),
        input_bytes=st.inputs.get(name, 0), entry_bytes=st.entry.get(name, 0), outside_bytes=st.outside.get(name, 0),
        **_code_held(name, st),
        outside_kept_bytes=st.outside_kept.get(name, 0), input_saved_bytes=st.input_saved.get(name, 0),
        input_saved_before_bytes=st.input_saved_before.get(name, 0),
        input_resaved_bytes=st.input_resaved.get(name, 0), input_shared_bytes=st.input_shared.get(name, 0),
        input_saved_outside_bytes=st.input_saved_outside.get(name, 0), calls=max(1, st.calls.get(name, 1)),
        input_needs_grad=name == L.ROOT or name in st.grad_inputs or not st.calls.get(name),  # unseen: unknown
        forward_flops=fwd,
        backward_flops=bwd,
        forward_moved_bytes=st.moved["fwd"].get(name, 0), backward_moved_bytes=st.moved["bwd"].get(name, 0),
        children=kids)


# [Note: where the root's tied gradient appears]
# A tensor the root owns under two names (a tied embedding and head) gets its gradient from
# both uses; autograd holds it from the first use backward meets, the last one forward made.
# That is a tied head's, mostly the code after the last layer, whose backward runs first
# (`sim.memory.root_grad_bytes`). But a wrapper may compute the LM loss and then run a layer
# of its own (an auxiliary head over `output_hidden_states`): the layers after the head's, and
# the head's code until its matmul's backward, run before the gradient exists. The trace
# records the layer running (or run last) at each forward read of such a tensor; the latest
# read's layer is marked `LayerProfile.makes_tied_grad`. A tied GPT-2 inside such a wrapper was
# 11.7% over its verified full_shard peak and 7.7% over under replicate, every moment before
# the head's backward charged the whole embedding's gradient.

def _tied_grad_layer(tracer: Tracer, model: nn.Module, asg) -> str | None:
    """The layer whose backward (or its outside code's) first makes the gradient of a tensor
    the root owns under several names; None where no such tensor was read after the first layer."""
    by_id = L.param_names(model)
    root = {n for p in asg.params.get(L.ROOT, []) for n in by_id[id(p)] if len(by_id[id(p)]) > 1}
    uses = [use for k, use in tracer.tied_use.items() if root & set(tracer.tied_names[k])]
    if not uses:
        return None
    layer = fold_target(max(uses)[1], tracer.ran, asg.layers)
    return layer if layer not in (None, L.ROOT) else None


def _tied_not_in_flight(layers: list[LayerProfile], tied: str | None, nbytes: int) -> list[LayerProfile]:
    """Where the root's tied gradient appears after the first layer window opened (a layer
    before the last makes it), the windows that open later measured it in flight ([Note:
    gradients held beside a window] in profile/workspace.py); the memory model counts it as the
    root's (`sim.memory.root_grad_bytes`), so it is taken off their workspaces and flight (a
    wrapped BERT whose second loss follows the MLM head was 12.7% over under +ckpt)."""
    names = [lay.name for lay in layers]
    if tied is None or not nbytes or tied == names[-1]:
        return layers
    out, at = [], names.index(tied)
    for k, lay in enumerate(layers):
        cut = min(lay.flight_bytes, nbytes) if lay.name != L.ROOT and k <= at else 0
        out.append(dataclasses.replace(lay, flight_bytes=lay.flight_bytes - cut,
                                       workspace_bytes=max(0, lay.workspace_bytes - cut),
                                       bucketed_workspace_bytes=max(0, lay.bucketed_workspace_bytes - cut))
                   if cut else lay)
    return out


def _selective(name: str, sc: SacStats, device: DeviceSpec) -> tuple:
    """(saved bytes, outside input bytes, forward bytes, recompute seconds) of one policy."""
    return (sc.saved.get(name, 0), sc.outside.get(name, 0), sc.forward.get(name, 0) if name != L.ROOT else 0,
            device.compute_seconds(dict(sc.flops.get(name, {}))) + sc.moved.get(name, 0) / device.memory_bandwidth)


def _code_held(name: str, st: Stats) -> dict:
    """`LayerProfile.code_held`, `code_held_bytes` and `held_to_save_bytes` ([Note: outputs the
    caller's code holds])."""
    if st.held is None:
        return {}
    per, always, pending = code_held(st.held, st.out_status, name, st.final)
    # [Note: results of outside code the caller holds] in profile/held.py
    outside = st.outside_held.get(name, 0) if name in st.final else 0
    return {"code_held": per, "code_held_bytes": always + outside, "held_to_save_bytes": pending}


# [Note: a repeated layer between other layers]
# A module called again after another layer ran (`layers = [L0, L1, L0, L1]`: one object at
# two places, [Note: one layer object at two places] in profile/layers.py) cannot be a layer of
# the chain of units: its backward runs at each call's place, around the layers between, which
# a unit before or after them cannot express (an auto plan that checkpointed L0 as a unit of its
# own was 22% under its verified peak, L1's activations live through L0's second backward). Its
# parameters go to the root, and it is traced again as no layer (`Escapes.between`): each
# call's work is code between layers, the outside code of the layer before that call, its
# backward where that call's runs. Folded whole into the layer before its first call instead
# (`fold`, still the answer past the rounds `settled_layers` allows), its later calls'
# activations were charged live through the backward of the layers between (an encoder
# [L0, L1, L0] fused under auto: +3.6%; +15% on full_shard). ALBERT's block, called n times in
# a row, is one layer ([Note: repeated modules] in plan/units.py).


def _unique(params) -> list[nn.Parameter]:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def trace_profile(model: nn.Module, example_inputs: Sequence[Any], *, name: str, device: DeviceSpec,
                  layers: Sequence[str] | None = None, compute_dtype: str = "float32",
                  tensors: str = "fake") -> Profile:
    """Profile `model(*example_inputs)` (the scalar loss) on fake tensors, layer by layer.

    The model may live on the meta device; neither it nor the inputs are changed. `tensors`
    "real": on real copies, for a model whose code reads values ([Note: a trace on real tensors])."""
    if compute_dtype not in DTYPES:
        raise UsageError(f"unknown compute dtype {compute_dtype!r}: accepted {', '.join(DTYPES)}")
    inputs = tuple(example_inputs)
    last = {}

    def run(names: list[str]) -> Escapes:
        children = {n: L.param_children(model, n) for n in names}
        stacks = find_stacks(model, names)
        traced = [n for n in names if not untraced(n, stacks)]
        with Truncated(model, stacks):
            tracer = _run(model, inputs, traced, {n: children[n] for n in traced}, DTYPES[compute_dtype],
                          real=tensors == "real")
        last.update(tracer=tracer, children=children, stacks=stacks)
        tracer.escapes.between = {n for n in traced if tracer.sequence.count(n) > 1}
        return tracer.escapes

    names, escapes = settled_layers(model, [n for n in L.candidates(model, layers) if n != L.ROOT], run)
    tracer, children, stacks = last["tracer"], last["children"], last["stacks"]
    tracer.stats.unused_ids = unused_ids(model, tracer.stats.no_grad, lambda n: traced_source(n, stacks))
    expand(tracer, names, [c for cs in children.values() for c in cs], stacks)
    # [Note: a repeated layer between other layers]
    ran = [n for n in tracer.ran if tracer.sequence.count(n) < 2]
    asg = L.assign(model, names, ran)
    fold(tracer.stats, tracer.ran, asg.layers)
    tracer.stats.final = set(asg.layers)
    out = []
    for n in asg.layers:
        kids = children.get(n, [])
        kids = [c for c in tracer.kids_ran if c in kids] if all(c in tracer.kids_ran for c in kids) else []
        if tracer.stats.calls.get(n, 1) > 1:  # [Note: repeated modules]: never split into children
            kids = []
        if any(c in tracer.stats.aliased for c in kids):  # [Note: inputs passed twice]: a child as a unit
            kids = []  # of its own would get each argument wrapped apart by FSDP2, another program
        if n in escapes.kids:  # its code reads a child's parameter: [Note: a parameter used outside its layer]
            kids = []
        kid_profiles = tuple(_layer(c, _unique(model.get_submodule(c).parameters()), tracer.stats, device)
                             for c in kids)
        out.append(_layer(n, asg.params[n], tracer.stats, device, kid_profiles))
    if [lay.name for lay in out] == [L.ROOT]:  # no layer: the root's forward is the model's ([Note: the
        root = out[0]  # root's backward tail] in profile/workspace.py)
        out = [dataclasses.replace(root, forward_peak_bytes=max(0, tracer.stats.forward_top - root.activation_bytes))]
    tied = _tied_grad_layer(tracer, model, asg)
    out = [dataclasses.replace(lay, makes_tied_grad=True) if lay.name == tied else lay for lay in out]
    out = _tied_not_in_flight(out, tied, asg.root_tied_numel * tracer.stats.itemsize)
    from shardsched.profile.measure import batch_and_seq, inputs_extra
    micro_batch, seq = batch_and_seq(inputs)
    return Profile(model=name, layers=tuple(out), fingerprint=fingerprint(model), compute_dtype=compute_dtype,
                   micro_batch=micro_batch, seq=seq, input_bytes=sum(storage_bytes([t]) for t in L.tensors_in(inputs)),
                   source="traced", tied=asg.tied, root_tied_numel=asg.root_tied_numel,
                   buffer_bytes=L.buffer_bytes(model), loss_bytes=tracer.stats.loss_bytes,
                   extra={"device": device.name, "torch": torch.__version__,
                          **L.notes_extra(model), **inputs_extra(inputs)})
