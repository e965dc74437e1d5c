"""What the trace records while the model runs (`profile.trace`): per layer and child, the
FLOPs by op class, the bytes saved for backward and the workspace, from hooks on modules,
autograd nodes and dispatched ops."""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections import defaultdict

import torch
import torch.nn as nn
import torch.utils.flop_counter as fc
from torch.overrides import TorchFunctionMode
from torch.multiprocessing.reductions import StorageWeakRef

from shardsched.profile import layers as L
from shardsched.profile.escapes import given_twice
from shardsched.profile.attention_flops import CAUSAL_SDPA_FORMULAS
from shardsched.profile.held import HeldOutputs, OutputStatus
from shardsched.core import sac_policy as sac


_TAG = "shardsched_layer"
PRE = "<before>"
_aten = torch.ops.aten
_CLASSES = {
    "matmul": {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten._scaled_mm, _aten._grouped_mm},
    "conv": {_aten.convolution, _aten._convolution, _aten.convolution_backward, _aten.cudnn_convolution,
             _aten._slow_conv2d_forward, _aten.convolution_overrideable},
}


def _op_class(packet) -> str:
    return next((c for c, ops in _CLASSES.items() if packet in ops), "attention")


def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """MoE experts' grouped matmul (no formula in FlopCounterMode, which passes shapes):
    2 x output x contraction; when both operands are 2-D the groups split the contraction."""
    groups = out_shape[0] if len(a_shape) == 2 and len(b_shape) == 2 else 1
    return 2 * math.prod(out_shape) * a_shape[-1] // groups


# SDPA on fake CPU tensors dispatches to the CPU flash kernel; FlopCounterMode prices it over
# the full score matrix, these the triangle a causal kernel computes (`profile.attention_flops`).
_CUSTOM = {**CAUSAL_SDPA_FORMULAS, _aten._grouped_mm: _grouped_mm_flops}

def _metadata_query(packet) -> bool:
    """`prim::device` and its kind: a fake tensor answers `t.device` through the dispatcher;
    a real one never dispatches it, so it is no op the host launches."""
    return getattr(packet, "_qualified_op_name", "").startswith("prim::")


class Stats:
    """Per key (a layer or child path): what its forward and backward cost."""

    def __init__(self):
        self.flops = {ph: defaultdict(lambda: defaultdict(float)) for ph in ("fwd", "bwd")}
        self.moved = {ph: defaultdict(int) for ph in ("fwd", "bwd")}
        self.ops: dict[str, int] = defaultdict(int)  # forward ops dispatched, `LayerProfile.forward_ops`
        self.acts: dict[str, int] = defaultdict(int)
        self.aliased: set[str] = set()  # modules given one tensor at two arguments: [Note: inputs passed twice]
        self.workspace: dict[str, int] = defaultdict(int)  # measured, `profile.workspace`
        self.itemsize = 4  # of the compute dtype: the bytes of a gradient element
        self.loss_bytes = 8  # `Profile.loss_bytes`
        self.no_grad: frozenset[str] = frozenset()  # traced names given no gradient: profile/unused.py
        self.unused_ids: set[int] = set()  # the model's parameters among them ([Note: parameters a step never uses])
        self.inputs: dict[str, int] = defaultdict(int)
        self.entry: dict[str, int] = defaultdict(int)  # `LayerProfile.entry_bytes`
        self.calls: dict[str, int] = defaultdict(int)  # forward calls of each module
        self.grad_inputs: set[str] = set()  # modules a call gave an input needing a gradient
        self.forward_peak: dict[str, int] = defaultdict(int)  # measured, [Note: forward windows]
        self.recompute_peak: dict[str, int] = defaultdict(int)  # the same, up to its last save
        self.forward_nosave: dict[str, int] = defaultdict(int)  # the same, saving nothing
        self.exit: dict[str, int] = defaultdict(int)  # measured, [Note: exit windows]
        self.recall: dict[str, int] = defaultdict(int)  # repeated modules' later calls' windows
        self.flight: dict[str, int] = defaultdict(int)  # gradients in flight as its backward starts
        self.forward_top = 0  # the most live in forward (`BackwardWorkspace.forward_top`)
        self.bucketed: dict[str, int] = defaultdict(int)  # backward windows, gradients bucketed
        self.output: dict[str, int] = defaultdict(int)  # `LayerProfile.output_bytes`
        self.outside: dict[str, int] = defaultdict(int)  # `LayerProfile.outside_bytes`
        self.outside_kept: dict[str, int] = defaultdict(int)  # `LayerProfile.outside_kept_bytes`
        self.saved_inside: dict = {}  # storage saved first by a layer's own code -> that layer
        self.fresh_inputs: dict[str, set] = {}  # per module, its first call's inputs nothing saved before
        self.out_status = OutputStatus()  # [Note: outputs the caller's code holds]
        self.held: HeldOutputs | None = None
        # [Note: results of outside code the caller holds] in profile/held.py
        self.outside_made: dict[int, tuple] = {}  # storage key -> (StorageWeakRef, bytes), made outside every layer
        self.layer_input_keys: set = set()  # storages some layer's call has taken as an input
        self.outside_held: dict[str, int] = defaultdict(int)  # per layer: such results alive, unsaved, as it starts
        self.final: set[str] = set()  # the layers the profile keeps (after folding)
        self.input_saved: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_bytes`
        self.input_saved_before: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_before_bytes`
        self.input_saved_outside: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_outside_bytes`
        self.input_resaved: dict[str, int] = defaultdict(int)  # `LayerProfile.input_resaved_bytes`
        self.input_shared: dict[str, int] = defaultdict(int)  # `LayerProfile.input_shared_bytes`
        self.before_keys: dict[str, set] = {}  # per module, its first call's inputs an earlier layer saved
        self.outside_largest: dict[str, int] = defaultdict(int)  # its largest tensor
        self.loss_window: dict[str, int] = defaultdict(int)  # measured, [Note: the loss's backward window]
        self.largest_saved: dict[str, int] = defaultdict(int)  # per key: folded keys become outside
        # selective checkpointing ([Note: the selective checkpointing policy] in core/sac_policy.py)
        self.sac = {mode: SacStats(mode) for mode in sac.MODES}  # per policy (`+sac`, `+sac-all`)
        self.sac_forward = True  # the traced forward runs (`_sac_read_outside`)


class SacStats:
    """What one selective policy keeps and recomputes, per key."""

    def __init__(self, mode):
        self.policy = sac.Policy(mode)  # its mm counter restarts at each layer's call
        self.saved: dict[str, int] = defaultdict(int)  # `LayerProfile.selective_saved_bytes`
        self.flops = defaultdict(lambda: defaultdict(float))  # forward FLOPs it recomputes
        self.moved: dict[str, int] = defaultdict(int)  # forward bytes moved by ops it recomputes
        self.seen: dict = {}  # storages counted in `saved` -> the keys that counted them
        self.outside: dict[str, int] = defaultdict(int)  # `LayerProfile.selective_outside_input_bytes`
        self.read_outside: set = set()  # storages counted there
        self.forward: dict[str, int] = defaultdict(int)  # forward windows keeping what it stores
        self.input_stored: dict[str, int] = defaultdict(int)  # `LayerProfile.selective_input_stored_bytes`
        self.input_stored_by: dict[int, list[str]] = defaultdict(list)  # storages counted there -> the layers
        self.unstored: set = set()  # stored storages whose producer counts them no more (`_shared_output`)

    def unstore(self, key: str, k: int, nbytes: int) -> None:
        """Storage `k`, stored by `key`'s policy, is counted where another key saves it first:
        not in `key`'s saved bytes, and not by a layer whose input it is ([Note: an input an
        earlier layer's policy stores] in plan/units.py: a BatchNorm saving its conv's output
        keeps it as its own activation, `selective_input_stored_bytes` 0; a ResNet's stem under
        shard_grad_op+sac: -8.7% taken off twice)."""
        self.saved[key] -= nbytes
        self.unstored.add(k)
        for name in self.input_stored_by.pop(k, ()):
            self.input_stored[name] -= nbytes


class Tracer:
    """Who runs now, in forward (hook stack) and backward (node tags)."""

    def __init__(self, model: nn.Module, layers: list[str], children: dict[str, list[str]]):
        self.layer_set = set(layers)
        self.parent = {c: lay for lay, cs in children.items() for c in cs}
        self.stack: list[str] = []
        self.ran: list[str] = []
        self.kids_ran: list[str] = []
        self.sequence: list[str] = []  # layers as they are called, each run of calls once
        self.last: str | None = None
        self.last_kid: dict[str, str] = {}  # per layer, its child that ran last in its current call
        self.bwd_key: tuple[str, ...] = ()
        self.stats = Stats()
        self.saved_keys: set = set()  # storages saved for backward so far (and persistent ones): `_run`
        self.persistent_keys: set = set()  # parameters, buffers, the model's inputs: `_run`
        self.escapes = None  # `Escapes`, set by the trace: it also hears of aliased layers
        # [Note: where the root's tied gradient appears] in profile/trace.py
        self.tied_names: dict = {}  # storage key of a tensor reachable by several names -> them
        self.tied_use: dict = {}  # such a key -> (forward order, layer) of its last read in forward
        self.tied_clock = 0
        self.handles = []
        for name in [*layers, *self.parent]:
            self._attach(model.get_submodule(name), name)

    def _attach(self, module: nn.Module, name: str) -> None:
        def pre(m, args, kwargs):
            # Every call's inputs: a checkpointed layer (or a partitioned layer's child, a
            # unit of its own) keeps them all; a module applied several times (ALBERT's shared
            # layer) is one layer with `calls` > 1 ([Note: repeated modules] in plan/units.py).
            # The model's inputs and parameters are counted apart (`Profile.input_bytes`, the
            # parameters): keeping them costs a checkpointed layer nothing.
            self.stats.inputs[name] += storage_bytes([t for t in L.tensors_in((args, kwargs))
                                                if storage_key(t) not in self.persistent_keys])
            if not self.stats.calls[name]:  # its first call: the input nothing saved yet
                fresh = {storage_key(t): t for t in L.tensors_in((args, kwargs))
                         if storage_key(t) not in self.saved_keys}
                self.stats.entry[name] = storage_bytes(list(fresh.values()))
                self.stats.fresh_inputs[name] = set(fresh)
                # of the rest, what an earlier layer's own code saved first (`input_saved_before_bytes`)
                before = {storage_key(t): t for t in L.tensors_in((args, kwargs))
                          if self.stats.saved_inside.get(storage_key(t), name) != name}
                self.stats.input_saved_before[name] = storage_bytes(list(before.values()))
                self.stats.before_keys[name] = set(before)
                # and what code outside every layer saved first: that code keeps it anyway
                outside = {storage_key(t): t for t in L.tensors_in((args, kwargs))
                           if storage_key(t) in self.saved_keys and storage_key(t) not in self.persistent_keys
                           and storage_key(t) not in self.stats.saved_inside}
                self.stats.input_saved_outside[name] = storage_bytes(list(outside.values()))
            if name in self.layer_set and not self.stats.calls[name]:
                prev = self.sequence[-1] if self.sequence else None  # the layer before it: only its policy
                for sc in self.stats.sac.values():  # [Note: an input an earlier layer's policy stores]
                    stored = {storage_key(t): t for t in L.tensors_in((args, kwargs)) if storage_key(t) not in
                              sc.unstored and prev in sc.seen.get(storage_key(t), ())}
                    sc.input_stored[name] = storage_bytes(list(stored.values()))
                    for k in stored:
                        sc.input_stored_by[k].append(name)
                # `LayerProfile.input_shared_bytes`
                self.stats.input_shared[name] = storage_bytes([
                    t for t in L.tensors_in((args, kwargs)) if storage_key(t) in self.stats.layer_input_keys
                    and storage_key(t) not in self.persistent_keys])
                self._outside_held(name, {storage_key(t) for t in L.tensors_in((args, kwargs))})
            if given_twice(args, kwargs):  # [Note: inputs passed twice]: a child is never a unit,
                self.stats.aliased.add(name)  # a layer is joined into its caller
                if name in self.layer_set and self.escapes is not None:
                    self.escapes.aliased.add(name)
            self.stats.calls[name] += 1
            # `LayerProfile.input_needs_grad` (under no_grad, a reentrant checkpoint's forward,
            # FSDP2 hooks the recomputation instead)
            if not torch.is_grad_enabled() or any(t.requires_grad for t in L.tensors_in((args, kwargs))):
                self.stats.grad_inputs.add(name)
            if name in self.layer_set:
                if not self.sequence or self.sequence[-1] != name:
                    self.sequence.append(name)
                for sc in self.stats.sac.values():  # a checkpointed call: torchtitan's `meta` is new
                    sc.policy.reset()
                if name not in self.ran:
                    self.ran.append(name)
                self.last = name
                self.last_kid.pop(name, None)
            else:
                self.last_kid[self.parent[name]] = name
                if name not in self.kids_ran:
                    self.kids_ran.append(name)
            self.stack.append(name)

        def post(m, args, kwargs, out):
            self.stats.output[name] = max(self.stats.output[name], storage_bytes(L.tensors_in(out)))
            self.stack.pop()
            if name in self.layer_set and self.stats.calls[name] == 1:
                self._produced(name, out)

        self.handles += [module.register_forward_pre_hook(L.in_forward(pre), with_kwargs=True),
                         module.register_forward_hook(L.in_forward(post), with_kwargs=True)]

    def _outside_held(self, name: str, inputs: set) -> None:
        """What code outside every layer made that is alive, saved by nothing and no layer's
        input so far, as `name` starts ([Note: results of outside code the caller holds])."""
        st = self.stats
        st.layer_input_keys |= inputs
        # a result once dead, saved or taken as an input is never held so again: dropped (keys
        # stay pinned while the trace runs), so each layer's start walks the live ones only
        st.outside_made = {k: v for k, v in st.outside_made.items() if not v[0].expired()
                           and k not in self.saved_keys and k not in st.layer_input_keys}
        st.outside_held[name] = sum(nbytes for _, nbytes in st.outside_made.values())

    def _produced(self, name: str, out) -> None:
        """What the plain trace counted each output of layer `name` as (`OutputStatus`)."""
        st = self.stats
        for idx, t in enumerate(L.tensors_in(out)):
            k = storage_key(t)
            saver = st.saved_inside.get(k) or ("<counted>" if k in self.saved_keys else None)
            kept = tuple(name in st.sac[m].seen.get(k, ()) for m in sac.MODES)
            st.out_status.produced((name, idx), k, t.untyped_storage(), saved_by=saver, sac=kept)

    def forward_key(self) -> tuple[str, ...]:
        """(layer, child) running now; outside every layer: the last layer run, or
        `PRE` (folded into the first layer) before any ran."""
        layer = next((n for n in reversed(self.stack) if n in self.layer_set), None) or self.last or PRE
        child = next((n for n in reversed(self.stack) if self.parent.get(n) == layer), None)
        return (layer,) if child is None else (layer, child)

    def after_child(self) -> str | None:
        """The child whose outside code runs now: the layer's own code (no child running)
        after one of its children ran in this call ([Note: the parent's own code in a
        partition] in plan/units.py); None elsewhere."""
        keys = self.forward_key()
        return self.last_kid.get(keys[0]) if len(keys) == 1 and not self.outside() else None

    def outside(self) -> bool:
        """No layer's module is running: the code belongs to no layer (folded into one)."""
        return not any(n in self.layer_set for n in self.stack)

    def key(self) -> tuple[tuple[str, ...], str]:
        node = torch._C._current_autograd_node()
        if node is None:
            return self.forward_key(), "fwd"
        tag = node.metadata.get(_TAG)
        if tag is not None:
            self.bwd_key = tag
        return self.bwd_key or self.forward_key(), "bwd"

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class Tagger(TorchFunctionMode):
    """Tags each autograd node created in forward with the layer that created it."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch._C._current_autograd_node() is None:
            if self.tracer.tied_names:
                self._tied_reads((args, kwargs))
            for t in L.tensors_in(out):
                if t.grad_fn is not None and _TAG not in t.grad_fn.metadata:
                    t.grad_fn.metadata[_TAG] = self.tracer.forward_key()
        return out

    def _tied_reads(self, tree) -> None:
        """Note the layer running as forward reads a tensor reachable by several names ([Note:
        where the root's tied gradient appears] in profile/trace.py)."""
        tr = self.tracer
        for t in L.tensors_in(tree):
            k = storage_key(t)
            if k in tr.tied_names:
                tr.tied_clock += 1
                tr.tied_use[k] = (tr.tied_clock, tr.forward_key()[0])


class FlopCounter(fc.FlopCounterMode):
    """FlopCounterMode that also attributes each op to the running layer."""

    def __init__(self, tracer: Tracer):
        super().__init__(display=False, custom_mapping=_CUSTOM)
        self.tracer = tracer
        # Its module tracker (attribution we do not read: the tracer attributes) hooks every
        # module's outputs with `register_multi_grad_hook`, whose hook holds the nodes it hooks:
        # a node whose backward never runs (a checkpointed region's) kept its saved tensors
        # until Python's garbage collector ran ([Note: a checkpoint inside the model]).
        self.mod_tracker = contextlib.nullcontext()

    def _count_flops(self, func_packet, out, args, kwargs):
        keys, phase = self.tracer.key()
        st = self.tracer.stats
        selective = phase == "fwd" and not self.tracer.outside()  # code a selective layer runs
        if phase == "fwd" and not selective:
            self._sac_read_outside(L.tensors_in((args, kwargs)))
        if phase == "fwd" and not _metadata_query(func_packet):
            for k in keys:
                st.ops[k] += 1
        recomputed = []  # the policies that recompute it
        for sc in st.sac.values():
            if selective and sc.policy.saves(func_packet):
                self._sac_saved(sc, keys, L.tensors_in(out))
            elif selective:
                recomputed.append(sc)
        if phase == "fwd" and st.sac_forward and self.tracer.outside():
            self._outside_made(L.tensors_in(out), {storage_key(t) for t in L.tensors_in((args, kwargs))})
        if func_packet in self.flop_registry:
            flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            for k in keys:
                st.flops[phase][k][_op_class(func_packet)] += flops
                for sc in recomputed:
                    sc.flops[k][_op_class(func_packet)] += flops
        else:
            outs, ins = L.tensors_in(out), L.tensors_in((args, kwargs))
            in_keys = {storage_key(t) for t in ins}
            if any(storage_key(t) not in in_keys for t in outs):  # a fresh result: not a view or in-place
                for k in keys:
                    st.moved[phase][k] += storage_bytes(ins) + storage_bytes(outs)
                    for sc in recomputed:
                        sc.moved[k] += storage_bytes(ins) + storage_bytes(outs)
        return out

    def _outside_made(self, outs: list[torch.Tensor], in_keys: set) -> None:
        """Results of code outside every layer ([Note: results of outside code the caller holds])."""
        st = self.tracer.stats
        for t in outs:
            k = storage_key(t)
            if k not in in_keys and k not in self.tracer.persistent_keys and k not in st.outside_made \
                    and k not in st.layer_input_keys and k not in self.tracer.saved_keys:
                st.outside_made[k] = (StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes())

    def _sac_read_outside(self, ins: list[torch.Tensor]) -> None:
        """Saved outputs that code outside every layer reads (`selective_outside_input_bytes`)."""
        st = self.tracer.stats
        if not st.sac_forward:  # forward is over: their storages are freed, their keys reused
            return
        for t in ins:
            k = storage_key(t)
            for sc in st.sac.values():
                if k in sc.seen and k not in sc.read_outside:
                    sc.read_outside.add(k)
                    for key in sc.seen[k]:
                        sc.outside[key] += t.untyped_storage().nbytes()

    @staticmethod
    def _sac_saved(sc: SacStats, keys, outs: list[torch.Tensor]) -> None:
        """The outputs selective checkpointing stores (all of a saved op's), each storage once."""
        fresh = list({storage_key(t): t for t in outs if storage_key(t) not in sc.seen}.values())
        sc.seen.update((storage_key(t), keys) for t in fresh)
        for k in keys:
            sc.saved[k] += storage_bytes(fresh)


# [Note: storage keys]
# The trace names a storage by its StorageImpl's address (`_cdata`: a fake tensor has no data
# pointer, a view shares its base's storage). The allocator gives a dead storage's address to
# the next one, so a key kept in a set or a dict (an input seen, a saved output that outside code
# read) came to name a later storage, and a profile depended on the allocator's history: in one
# CI run a U-Net head's output, allocated where the upsampled tensor the model's code had read
# once lay, counted 0 selective outside input bytes, not 48 KiB. While a trace runs
# (`pinned_storage_keys`), each key handed out holds a weak reference to its StorageImpl: the
# bytes are freed when the storage dies (a strong reference would hold bytes the windows then
# count, [Note: exit windows]), the address stays taken until the trace ends.
_PINNED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("shardsched_pinned_keys", default=None)


@contextlib.contextmanager
def pinned_storage_keys():
    """No storage takes a dead one's key inside this block ([Note: storage keys])."""
    token = _PINNED.set({})
    try:
        yield
    finally:
        _PINNED.reset(token)


def storage_key(t: torch.Tensor) -> int:
    st = t.untyped_storage()
    k = st._cdata
    pinned = _PINNED.get()
    if pinned is not None and k not in pinned:
        pinned[k] = StorageWeakRef(st)
    return k


def loss_bytes(loss: torch.Tensor) -> int:
    """`Profile.loss_bytes`: the loss's storage and the gradient `backward()` seeds it with."""
    return loss.untyped_storage().nbytes() + loss.element_size()


def storage_bytes(ts: list[torch.Tensor]) -> int:
    """Bytes of distinct storages among `ts`."""
    seen: dict[int, int] = {}
    for t in ts:
        seen.setdefault(storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


