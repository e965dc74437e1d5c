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
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
import warnings
import weakref
from collections import defaultdict
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.utils.flop_counter as fc
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.core.types import Checkpoint
from shardsched.cost.device import DeviceSpec
from shardsched.errors import UsageError
from shardsched.profile import layers as L
from shardsched.profile.attention_flops import CAUSAL_SDPA_FORMULAS
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.types import LayerProfile, Profile
from shardsched.profile.held import HeldOutputs, OutputStatus, code_held
from shardsched.profile.fake_rules import FakeRules as _FakeRules
from shardsched.profile.workspace import ROOT_TAIL, BackwardWorkspace
from shardsched.profile.workspace_terms import layer_workspace, outside_workspace
from shardsched.runtime import sac

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TAG = "shardsched_layer"
_PRE = "<before>"
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


class Untraceable(UsageError):
    """The model's code cannot run on fake tensors (a data-dependent op, `.item()`); the
    message names the op. `profile.resolve.profiled` then measures it for real."""


# [Note: HF causal masks on fake tensors]
# transformers (masking_utils.find_packed_sequence_indices) decides whether a batch packs
# several sequences per row by reading the position ids; it cannot read a fake tensor, so
# under FakeTensorMode it assumes packing and builds an explicit (batch, 1, T, T) mask, and
# SDPA then repeats K/V for grouped-query attention. Real tensors (the run) skip both:
# positions a model makes itself are one sequence per row. The trace traced another program
# than the one that runs (Llama with GQA: +9% activations). During the trace, a fake position
# tensor therefore counts as one sequence per row, as transformers answers for real ones.


@contextlib.contextmanager
def _hf_one_sequence_per_row():
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def find(position_ids, *args, **kwargs):
        if isinstance(position_ids, FakeTensor):
            return None
        return original(position_ids, *args, **kwargs)

    masking.find_packed_sequence_indices = find
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs a traceback for an op whose meta function raises before it
    re-raises (torch/_subclasses/fake_tensor.py); the error is reported in one line instead."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


class _Stats:
    """Per key (a layer or child path): what its forward and backward cost."""

    def __init__(self):
        self.flops = {ph: defaultdict(lambda: defaultdict(float)) for ph in ("fwd", "bwd")}
        self.moved = {ph: defaultdict(int) for ph in ("fwd", "bwd")}
        self.acts: dict[str, int] = defaultdict(int)
        self.aliased: set[str] = set()  # modules given one tensor at two arguments: [Note: inputs passed twice]
        self.workspace: dict[str, int] = defaultdict(int)  # measured, `profile.workspace`
        self.itemsize = 4  # of the compute dtype: the bytes of a gradient element
        self.inputs: dict[str, int] = defaultdict(int)
        self.entry: dict[str, int] = defaultdict(int)  # `LayerProfile.entry_bytes`
        self.calls: dict[str, int] = defaultdict(int)  # forward calls of each module
        self.forward_peak: dict[str, int] = defaultdict(int)  # measured, [Note: forward windows]
        self.forward_nosave: dict[str, int] = defaultdict(int)  # the same, saving nothing
        self.exit: dict[str, int] = defaultdict(int)  # measured, [Note: exit windows]
        self.recall: dict[str, int] = defaultdict(int)  # repeated modules' later calls' windows
        self.bucketed: dict[str, int] = defaultdict(int)  # backward windows, gradients bucketed
        self.output: dict[str, int] = defaultdict(int)  # `LayerProfile.output_bytes`
        self.outside: dict[str, int] = defaultdict(int)  # `LayerProfile.outside_bytes`
        self.outside_kept: dict[str, int] = defaultdict(int)  # `LayerProfile.outside_kept_bytes`
        self.saved_inside: dict = {}  # storage saved first by a layer's own code -> that layer
        self.fresh_inputs: dict[str, set] = {}  # per module, its first call's inputs nothing saved before
        self.out_status = OutputStatus()  # [Note: outputs the caller's code holds]
        self.held: HeldOutputs | None = None
        self.final: set[str] = set()  # the layers the profile keeps (after folding)
        self.input_saved: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_bytes`
        self.input_saved_before: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_before_bytes`
        self.input_saved_outside: dict[str, int] = defaultdict(int)  # `LayerProfile.input_saved_outside_bytes`
        self.outside_largest: dict[str, int] = defaultdict(int)  # its largest tensor
        self.largest_saved: dict[str, int] = defaultdict(int)  # per key: folded keys become outside
        # selective checkpointing ([Note: the selective checkpointing policy] in runtime/sac.py)
        self.sac = {mode: _Sac(mode) for mode in sac.MODES}  # per policy (`+sac`, `+sac-all`)
        self.sac_forward = True  # the traced forward runs (`_sac_read_outside`)


class _Sac:
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


class _Tracer:
    """Who runs now, in forward (hook stack) and backward (node tags)."""

    def __init__(self, model: nn.Module, layers: list[str], children: dict[str, list[str]]):
        self.layer_set = set(layers)
        self.parent = {c: lay for lay, cs in children.items() for c in cs}
        self.stack: list[str] = []
        self.ran: list[str] = []
        self.kids_ran: list[str] = []
        self.sequence: list[str] = []  # layers as they are called, each run of calls once
        self.last: str | None = None
        self.bwd_key: tuple[str, ...] = ()
        self.stats = _Stats()
        self.saved_keys: set = set()  # storages saved for backward so far (and persistent ones): `_run`
        self.persistent_keys: set = set()  # parameters, buffers, the model's inputs: `_run`
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
            self.stats.inputs[name] += _nbytes([t for t in L.tensors_in((args, kwargs))
                                                if _storage_key(t) not in self.persistent_keys])
            if not self.stats.calls[name]:  # its first call: the input nothing saved yet
                fresh = {_storage_key(t): t for t in L.tensors_in((args, kwargs))
                         if _storage_key(t) not in self.saved_keys}
                self.stats.entry[name] = _nbytes(list(fresh.values()))
                self.stats.fresh_inputs[name] = set(fresh)
                # of the rest, what an earlier layer's own code saved first (`input_saved_before_bytes`)
                before = {_storage_key(t): t for t in L.tensors_in((args, kwargs))
                          if self.stats.saved_inside.get(_storage_key(t), name) != name}
                self.stats.input_saved_before[name] = _nbytes(list(before.values()))
                # and what code outside every layer saved first: that code keeps it anyway
                outside = {_storage_key(t): t for t in L.tensors_in((args, kwargs))
                           if _storage_key(t) in self.saved_keys and _storage_key(t) not in self.persistent_keys
                           and _storage_key(t) not in self.stats.saved_inside}
                self.stats.input_saved_outside[name] = _nbytes(list(outside.values()))
            grads = [t for t in L.tensors_in((args, kwargs)) if t.requires_grad]
            if len({id(t) for t in grads}) < len(grads):
                self.stats.aliased.add(name)
            self.stats.calls[name] += 1
            if name in self.layer_set:
                if not self.sequence or self.sequence[-1] != name:
                    self.sequence.append(name)
                for sc in self.stats.sac.values():  # a checkpointed call: torchtitan's `meta` is new
                    sc.policy.reset()
                if name not in self.ran:
                    self.ran.append(name)
                self.last = name
            elif name not in self.kids_ran:
                self.kids_ran.append(name)
            self.stack.append(name)

        def post(m, args, kwargs, out):
            self.stats.output[name] = max(self.stats.output[name], _nbytes(L.tensors_in(out)))
            self.stack.pop()
            if name in self.layer_set and self.stats.calls[name] == 1:
                self._produced(name, out)

        self.handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                         module.register_forward_hook(post, with_kwargs=True)]

    def _produced(self, name: str, out) -> None:
        """What the plain trace counted each output of layer `name` as (`OutputStatus`)."""
        st = self.stats
        for idx, t in enumerate(L.tensors_in(out)):
            k = _storage_key(t)
            saver = st.saved_inside.get(k) or ("<counted>" if k in self.saved_keys else None)
            kept = tuple(name in st.sac[m].seen.get(k, ()) for m in sac.MODES)
            st.out_status.produced((name, idx), k, t.untyped_storage(), saved_by=saver, sac=kept)

    def forward_key(self) -> tuple[str, ...]:
        """(layer, child) running now; outside every layer: the last layer run, or
        `_PRE` (folded into the first layer) before any ran."""
        layer = next((n for n in reversed(self.stack) if n in self.layer_set), None) or self.last or _PRE
        child = next((n for n in reversed(self.stack) if self.parent.get(n) == layer), None)
        return (layer,) if child is None else (layer, child)

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


class _Tagger(TorchFunctionMode):
    """Tags each autograd node created in forward with the layer that created it."""

    def __init__(self, tracer: _Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch._C._current_autograd_node() is None:
            for t in L.tensors_in(out):
                if t.grad_fn is not None and _TAG not in t.grad_fn.metadata:
                    t.grad_fn.metadata[_TAG] = self.tracer.forward_key()
        return out


class _Counter(fc.FlopCounterMode):
    """FlopCounterMode that also attributes each op to the running layer."""

    def __init__(self, tracer: _Tracer):
        super().__init__(display=False, custom_mapping=_CUSTOM)
        self.tracer = tracer

    def _count_flops(self, func_packet, out, args, kwargs):
        keys, phase = self.tracer.key()
        st = self.tracer.stats
        selective = phase == "fwd" and not self.tracer.outside()  # code a selective layer runs
        if phase == "fwd" and not selective:
            self._sac_read_outside(L.tensors_in((args, kwargs)))
        recomputed = []  # the policies that recompute it
        for sc in st.sac.values():
            if selective and sc.policy.saves(func_packet):
                self._sac_saved(sc, keys, L.tensors_in(out))
            elif selective:
                recomputed.append(sc)
        if func_packet in self.flop_registry:
            flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            for k in keys:
                st.flops[phase][k][_op_class(func_packet)] += flops
                for sc in recomputed:
                    sc.flops[k][_op_class(func_packet)] += flops
        else:
            outs, ins = L.tensors_in(out), L.tensors_in((args, kwargs))
            in_keys = {_storage_key(t) for t in ins}
            if any(_storage_key(t) not in in_keys for t in outs):  # a fresh result: not a view or in-place
                for k in keys:
                    st.moved[phase][k] += _nbytes(ins) + _nbytes(outs)
                    for sc in recomputed:
                        sc.moved[k] += _nbytes(ins) + _nbytes(outs)
        return out

    def _sac_read_outside(self, ins: list[torch.Tensor]) -> None:
        """Saved outputs that code outside every layer reads (`selective_outside_input_bytes`)."""
        st = self.tracer.stats
        if not st.sac_forward:  # forward is over: their storages are freed, their keys reused
            return
        for t in ins:
            k = _storage_key(t)
            for sc in st.sac.values():
                if k in sc.seen and k not in sc.read_outside:
                    sc.read_outside.add(k)
                    for key in sc.seen[k]:
                        sc.outside[key] += t.untyped_storage().nbytes()

    @staticmethod
    def _sac_saved(sc: _Sac, keys, outs: list[torch.Tensor]) -> None:
        """The outputs selective checkpointing stores (all of a saved op's), each storage once."""
        fresh = list({_storage_key(t): t for t in outs if _storage_key(t) not in sc.seen}.values())
        sc.seen.update((_storage_key(t), keys) for t in fresh)
        for t in fresh:  # forget a storage when it dies (its key may be reused); keeping it alive
            # instead would hold bytes the live-bytes windows then count ([Note: exit windows])
            weakref.finalize(t.untyped_storage(), sc.seen.pop, _storage_key(t), None)
        for k in keys:
            sc.saved[k] += _nbytes(fresh)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _nbytes(ts: list[torch.Tensor]) -> int:
    """Bytes of distinct storages among `ts`."""
    seen: dict[int, int] = {}
    for t in ts:
        seen.setdefault(_storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


# ---------------------------------------------------------------- fake copies

def _fake_like(t: torch.Tensor, dtype: torch.dtype, mode: FakeTensorMode) -> torch.Tensor:
    """An empty fake CPU tensor of `t`'s shape (floating tensors in the compute dtype)."""
    with mode:
        return torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="cpu",
                           requires_grad=isinstance(t, nn.Parameter) and t.requires_grad)


def _fake_state(model: nn.Module, dtype: torch.dtype, mode: FakeTensorMode) -> dict[str, torch.Tensor]:
    """Fake parameters and buffers by name; a tensor reached by two names gets one fake."""
    by_id: dict[int, torch.Tensor] = {}
    state = {}
    items = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, t in items:
        if id(t) not in by_id:
            by_id[id(t)] = _fake_like(t, dtype, mode)
        state[name] = by_id[id(t)]
    return state


def _untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with each tensor under its first name only: `functional_call(tie_weights=True)`
    ties the other names itself."""
    seen: set[int] = set()
    out = {}
    for k, t in state.items():
        if id(t) not in seen:
            seen.add(id(t))
            out[k] = t
    return out


@contextlib.contextmanager
def _restored(model: nn.Module):
    """[Note: one module object at two places] `functional_call` swaps each name in and back
    out in turn; a module registered twice (`layers = [L0, L1, L0, L1]`) is swapped twice, so
    its second restore puts back the fake of the first swap, and the caller's model kept fake
    parameters (its next `.to()` failed). Every module's own tensors are put back here."""
    saved = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        yield
    finally:
        for m, params, buffers in saved:
            m._parameters.update(params)
            m._buffers.update(buffers)


def _module_params(state: dict[str, torch.Tensor], modules: list[str]) -> dict[str, list[torch.Tensor]]:
    """Per module path, the (fake) parameters under it that need a gradient, each once."""
    out = {}
    for m in modules:
        ts = {id(t): t for k, t in state.items() if k.startswith(m + ".") and t.requires_grad}
        out[m] = list(ts.values())
    return out


def _fake_inputs(inputs: tuple, dtype: torch.dtype, mode: FakeTensorMode) -> tuple:
    return tuple(_fake_like(x, dtype, mode) if isinstance(x, torch.Tensor) else x for x in inputs)


# [Note: boolean masks on fake tensors]
# A loss that reads a boolean mask (`logits[mask]`, `y[mask]`: a GNN's training nodes, a
# masked-LM's positions) has an output whose length is the mask's count: a fake tensor has no
# values, so `aten.index` failed (DynamicOutputShapeException on nonzero) and the model was
# profiled by running it for real (`profile/measure.py`), whose profile lacks the selective and
# window fields (a GNN's full_shard+sac plan was 33% over its verified peak). A mask that is one
# of the model's inputs (or a view of one) has its values in the caller's example inputs, so
# `_RealMasks` answers those ops from them: the mask's count on the real tensor, the op on fake
# integer indices of that length (what `nonzero` turns the mask into). Autograd saves the op's
# arguments above this mode (the mask, an input: no bytes), so what the trace counts is the
# program's. A mask the model computes from its inputs still cannot trace.

_aten = torch.ops.aten
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}


class _RealMasks(TorchDispatchMode):
    """Directly above FakeTensorMode: boolean-mask indexing by a mask the inputs hold."""

    def __init__(self, real: dict[int, torch.Tensor]):
        super().__init__()
        self.real = real  # fake input's storage key -> the real input (contiguous)

    def _real(self, t) -> tuple[int, int] | None:
        """(true count, dims) of a mask the inputs hold, else None."""
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bool:
            return None
        r = self.real.get(_storage_key(t))
        if r is None:
            return None
        with unset_fake_temporarily():
            return int(r.as_strided(t.shape, t.stride(), t.storage_offset()).sum()), t.dim()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEXING and len(args) > 1 and any(self._real(i) is not None for i in args[1]):
            indices = []
            for i in args[1]:
                r = self._real(i)
                if r is None:
                    indices.append(i)
                    continue
                indices += [torch.empty(r[0], dtype=torch.long, device=i.device) for _ in range(r[1])]
            args = (args[0], indices, *args[2:])
        elif func is _aten.nonzero.default and self._real(args[0]) is not None:
            r = self._real(args[0])
            return torch.empty(r, dtype=torch.long, device=args[0].device)
        return func(*args, **kwargs)


def _real_masks(inputs: tuple, fake_inputs: tuple) -> _RealMasks:
    return _RealMasks({_storage_key(f): r.detach().contiguous() for r, f in zip(inputs, fake_inputs)
                       if isinstance(r, torch.Tensor) and r.dtype == torch.bool and isinstance(f, torch.Tensor)})


def loss_of(out: Any) -> torch.Tensor:
    """The scalar loss a model's forward returns; UsageError (one line) otherwise."""
    loss = out.loss if hasattr(out, "loss") and not isinstance(out, torch.Tensor) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = type(out).__name__ if not isinstance(out, torch.Tensor) else f"a tensor of shape {tuple(out.shape)}"
        raise UsageError(f"model(*example_inputs) must return the scalar loss, got {got}; "
                         f"accepted: a builder whose model returns its loss")
    return loss.reshape(())


# ---------------------------------------------------------------- the trace

# [Note: what outside code saves again]
# A storage is counted once, at the code that saved it first. A conv block's ReLU saves its
# output, and the pooling after the block (code outside every layer: the model's own forward,
# a U-Net's encoder) saves the same tensor again: it is in the block's activations and nowhere
# else. When the block recomputes it saves nothing, but the pooling still holds its output until
# its own backward, so a checkpointed block keeps it beside its inputs
# (`LayerProfile.outside_kept_bytes`, read by `plan.units.kept_when_checkpointed`). A U-Net
# checkpointed everywhere ran 9.6% above its prediction without it (its encoders' outputs).

def _run(model: nn.Module, inputs: tuple, names: list[str], children: dict, dtype: torch.dtype) -> _Tracer:
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    state = _fake_state(model, dtype, mode)
    fake_inputs = _fake_inputs(inputs, dtype, mode)
    exclude = {_storage_key(t) for t in [*state.values(), *L.tensors_in(fake_inputs)]}
    tracer = _Tracer(model, names, children)
    tracer.saved_keys, tracer.persistent_keys = exclude, set(exclude)
    tracer.stats.itemsize = torch.empty((), dtype=dtype).element_size()
    ws = BackwardWorkspace(model, names, list(tracer.parent), persistent=[*state.values(), *L.tensors_in(fake_inputs)],
                           parents=tracer.parent, params=_module_params(state, [*names, *tracer.parent]))
    kept: list[torch.Tensor] = []  # keep saved storages alive: no StorageImpl reuse while we dedupe
    rules = _FakeRules()
    masks = _real_masks(inputs, fake_inputs)  # [Note: boolean masks on fake tensors]

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = _storage_key(t)
        tracer.stats.out_status.saved(k, first=k not in exclude, outside=tracer.outside(), layer=tracer.forward_key()[0])
        if k in exclude and tracer.outside():  # [Note: what outside code saves again]
            owner = tracer.stats.saved_inside.pop(k, None)
            if owner is not None:
                tracer.stats.outside_kept[owner] += t.untyped_storage().nbytes()
        if k not in exclude:
            exclude.add(k)
            if not tracer.outside():
                tracer.stats.saved_inside[k] = tracer.forward_key()[0]
                for key in tracer.forward_key():  # its own input, saved by its own code
                    if k in tracer.stats.fresh_inputs.get(key, ()):
                        tracer.stats.input_saved[key] += t.untyped_storage().nbytes()
            kept.append(t)
            nbytes = t.untyped_storage().nbytes()
            ws.note_saved(nbytes, t.untyped_storage())
            keys = tracer.forward_key()
            for key in keys:
                tracer.stats.acts[key] += nbytes
            st = tracer.stats
            _shared_output(st, k, keys, nbytes)
            st.largest_saved[keys[0]] = max(st.largest_saved[keys[0]], nbytes)
            if tracer.outside():
                st.outside[keys[0]] += nbytes
                st.outside_largest[keys[0]] = max(st.outside_largest[keys[0]], nbytes)
        return t

    try:
        with _restored(model), _quiet_fake_tensor_log(), _hf_one_sequence_per_row(), mode, masks, rules, _Counter(tracer), _Tagger(tracer), ws, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = loss_of(torch.func.functional_call(model, _untied(state), fake_inputs, tie_weights=True))
            ws.close_exits()  # the loss is computed: backward is not code between modules
            kept.clear()  # the graph holds what backward needs; activations must free as it runs
            tracer.stats.sac_forward = False
            loss.backward()
    except UsageError:
        raise
    except Exception as e:  # data-dependent ops and the like: the model cannot be traced
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        op = f"op {rules.failed} failed " if rules.failed else ""
        raise Untraceable(f"cannot trace the model on fake tensors: {op}({type(e).__name__}: {msg[:200]}); "
                          f"accepted: --measure to profile it on real tensors on this machine instead") from None
    finally:
        tracer.stats.workspace.update(ws.finish())
        tracer.stats.forward_peak.update(ws.forward)
        tracer.stats.exit.update(ws.exit)
        tracer.stats.recall.update(ws.recall)
        tracer.stats.bucketed.update(ws.bucketed)
        tracer.remove()
    with _restored(model), _quiet_fake_tensor_log(), _hf_one_sequence_per_row(), mode, masks, rules, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for keep, out in ((None, tracer.stats.forward_nosave),
                          *((m, tracer.stats.sac[m].forward) for m in sac.MODES)):
            held = None if keep else HeldOutputs(model, names)  # [Note: outputs the caller's code holds]
            try:
                out.update(_forward_without_saving(model, state, fake_inputs, names, list(tracer.parent),
                                                   [*state.values(), *L.tensors_in(fake_inputs)], keep_saved=keep))
            finally:
                if held is not None:
                    held.remove()
                    tracer.stats.held = held
    return tracer


class _KeepSaved(TorchDispatchMode):
    """Holds the outputs of the ops selective checkpointing stores under `mode`'s policy
    (`runtime.sac.Policy`, its mm counter restarted at each layer's call) to the end of
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


def _shared_output(st: _Stats, k: int, keys: tuple, nbytes: int) -> None:
    """A storage selective checkpointing keeps for one key (its output: the stem's Linear) that
    code of another key saves for backward first (the next block's norm): that key's saved
    tensors or kept inputs count it in any plan, so the producer's selective layer does not
    count it again (`LayerProfile.selective_saved_bytes`)."""
    for sc in st.sac.values():
        for key in sc.seen.get(k) or ():
            if key not in keys:
                sc.saved[key] -= nbytes


def _forward_without_saving(model: nn.Module, state: dict, inputs: tuple, names: list[str], children: list[str],
                            persistent: list, *, keep_saved=None) -> dict[str, int]:
    """Each layer's forward peak when it saves nothing, as a checkpointed layer's forward runs
    (non-reentrant checkpoint drops what autograd would save): the same forward under
    `no_grad`, watched by the live-bytes mode ([Note: forward windows] in profile/workspace.py).
    `keep_saved` (a selective mode): as a selective layer's forward runs, keeping what its policy stores.
    Run after the traced pass, its hooks removed, so nothing is counted twice."""
    ws = BackwardWorkspace(model, names, children, persistent=persistent)
    keep = _KeepSaved(keep_saved, model, names) if keep_saved else contextlib.nullcontext()
    try:
        with ws, torch.no_grad(), keep:
            torch.func.functional_call(model, _untied(state), inputs, tie_weights=True)
    finally:
        ws.finish()
    return ws.forward


# ---------------------------------------------------------------- repeated blocks
# [Note: one trace per repeated block]
# Fake tensors cost ~0.5 ms per op, so the 80 blocks of Llama-2-70B would take
# ~15 s. Blocks of a stack with the same structure (class, parameter and buffer
# names, shapes, dtypes) do the same work on the same shapes, so a stack of n >= 5
# such blocks is traced with its first three: entry 0 (may differ: T5's first block
# owns the position bias), entry 1 stands for entries 1..n-2, and entry 2 for the
# last (it carries whatever runs right after the stack). Exact for identical blocks.

_MIN_STACK = 5


def _signature(m: nn.Module) -> tuple:
    return (type(m).__name__, tuple((n, tuple(t.shape), t.dtype) for n, t in
                                    [*m.named_parameters(), *m.named_buffers()]))


def _stacks(model: nn.Module, names: list[str]) -> list[tuple[str, int]]:
    """(prefix, n) of each container whose entries are all layers, 1..n-1 alike."""
    out = []
    for path, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < _MIN_STACK:
            continue
        prefix = f"{path}." if path else ""
        if not all(f"{prefix}{i}" in names for i in range(len(m))):
            continue
        sigs = {_signature(m[i]) for i in range(1, len(m))}
        if len(sigs) == 1:
            out.append((prefix, len(m)))
    return out


class _Truncated:
    """Context: each stack holds only its first three entries while tracing."""

    def __init__(self, model: nn.Module, stacks: list[tuple[str, int]]):
        self.lists = [model.get_submodule(prefix[:-1]) for prefix, _ in stacks]
        self.saved = [dict(m._modules) for m in self.lists]

    def __enter__(self):
        for m, saved in zip(self.lists, self.saved):
            m._modules = {k: v for k, v in saved.items() if int(k) < 3}

    def __exit__(self, *exc):
        for m, saved in zip(self.lists, self.saved):
            m._modules = saved


def _entry(name: str, stacks) -> tuple[str, int, int, str] | None:
    """(prefix, n, index, rest) when `name` is inside a stack entry."""
    for prefix, n in stacks:
        if name.startswith(prefix):
            idx, _, rest = name[len(prefix):].partition(".")
            if idx.isdigit():
                return prefix, n, int(idx), "." + rest if rest else ""
    return None


def _untraced(name: str, stacks) -> bool:
    e = _entry(name, stacks)
    return e is not None and e[2] >= 3


def _source(name: str, stacks) -> str | None:
    """For entries 2..n-1 after tracing: the traced entry that stands for it."""
    e = _entry(name, stacks)
    if e is None or e[2] < 2:
        return None
    prefix, n, idx, rest = e
    return f"{prefix}{2 if idx == n - 1 else 1}{rest}"


def _expand(tracer: _Tracer, full: list[str], kids: list[str], stacks) -> None:
    """Give every entry 2..n-1 the stats of the traced entry that stands for it."""
    st = tracer.stats
    targets = [(name, _source(name, stacks)) for name in [*full, *kids] if _source(name, stacks)]
    plain = (st.acts, st.workspace, st.inputs, st.outside, st.outside_largest, st.calls, st.forward_peak,
             st.forward_nosave, st.entry, st.exit, st.output, st.recall, st.bucketed,
             st.outside_kept, st.input_saved, st.input_saved_before, st.input_saved_outside,
             *(d for sc in st.sac.values() for d in (sc.saved, sc.moved, sc.forward, sc.outside)))
    snap = {src: ({ph: dict(st.flops[ph].get(src, {})) for ph in ("fwd", "bwd")},
                  {ph: st.moved[ph].get(src, 0) for ph in ("fwd", "bwd")},
                  [d.get(src, 0) for d in plain], [dict(sc.flops.get(src, {})) for sc in st.sac.values()])
            for _, src in targets}
    for name, src in targets:
        flops, moved, rest, sac_flops = snap[src]
        for ph in ("fwd", "bwd"):
            st.flops[ph][name] = defaultdict(float, flops[ph])
            st.moved[ph][name] = moved[ph]
        for sc, f in zip(st.sac.values(), sac_flops):
            sc.flops[name] = defaultdict(float, f)
        for d, v in zip(plain, rest):
            d[name] = v

    def order(ran: list[str], names: list[str]) -> list[str]:
        out = []
        for r in ran:
            e = _entry(r, stacks)
            if e is not None and e[2] == 2:
                continue  # re-inserted below, after entry 1
            out.append(r)
            if e is not None and e[2] == 1:
                prefix, n, _, rest = e
                out += [f"{prefix}{i}{rest}" for i in range(2, n) if f"{prefix}{i}{rest}" in names]
        return out

    tracer.ran = order(tracer.ran, full)
    tracer.kids_ran = order(tracer.kids_ran, kids)


def _fold(stats: _Stats, ran: list[str], final: list[str]) -> None:
    """Work of keys that are not final layers (before any layer ran; layers that
    ran but own nothing) goes to the nearest final layer before them (or the first)."""
    order = [_PRE, *ran]
    for i, k in enumerate(order):
        if k in final or k == L.ROOT:
            continue
        target = next((o for o in reversed(order[:i]) if o in final), None) or \
            next((o for o in order[i:] if o in final), None)
        if target is None:
            continue
        for ph in ("fwd", "bwd"):
            for c, f in stats.flops[ph].pop(k, {}).items():
                stats.flops[ph][target][c] += f
            stats.moved[ph][target] += stats.moved[ph].pop(k, 0)
        # Its module is not the target's, so checkpointing the target does not recompute it
        # (nor does selective checkpointing store its outputs).
        for sc in stats.sac.values():
            for d in (sc.saved, sc.moved, sc.flops, sc.outside):
                d.pop(k, None)
        stats.outside[target] += stats.acts.get(k, 0)
        stats.acts[target] += stats.acts.pop(k, 0)
        stats.outside.pop(k, None)
        stats.outside_kept[target] += stats.outside_kept.pop(k, 0)
        stats.input_saved.pop(k, None)  # its inputs are not the target's
        stats.input_saved_before.pop(k, None)
        stats.input_saved_outside.pop(k, None)
        stats.outside_largest[target] = max(stats.outside_largest[target], stats.outside_largest.pop(k, 0),
                                            stats.largest_saved.pop(k, 0))
        stats.workspace[target] = max(stats.workspace[target], stats.workspace.pop(k, 0))
        stats.forward_peak[target] = max(stats.forward_peak[target], stats.forward_peak.pop(k, 0))
        stats.forward_nosave[target] = max(stats.forward_nosave[target], stats.forward_nosave.pop(k, 0))
        stats.exit[target] = max(stats.exit[target], stats.exit.pop(k, 0))
        stats.recall[target] = max(stats.recall[target], stats.recall.pop(k, 0))
        stats.bucketed[target] = max(stats.bucketed[target], stats.bucketed.pop(k, 0))
        for sc in stats.sac.values():
            sc.forward[target] = max(sc.forward[target], sc.forward.pop(k, 0))


def _workspace(name: str, params: Sequence[nn.Parameter], st: _Stats) -> int:
    """`LayerProfile.workspace_bytes`: the root's is its backward tail as measured (its base
    holds its gradients: [Note: the root's backward tail]); a layer's is its window above
    the model (a repeated module's: above the gradient its done calls accumulated, which
    `UnitCost.recall_bytes` counts)."""
    if name == L.ROOT:
        return max(st.workspace.get(ROOT_TAIL, 0), st.workspace.get(L.ROOT, 0))
    # what its outside code saved is freed by that code's backward before its window opens
    return layer_workspace(st.workspace.get(name, 0), st.acts.get(name, 0) - st.outside.get(name, 0),
                           sum(p.numel() for p in params) * st.itemsize)


def _layer(name: str, params: Sequence[nn.Parameter], st: _Stats, device: DeviceSpec,
           kids: tuple = ()) -> LayerProfile:
    fwd, bwd = dict(st.flops["fwd"].get(name, {})), dict(st.flops["bwd"].get(name, {}))
    bw = device.memory_bandwidth
    return LayerProfile(
        name=name, params=sum(p.numel() for p in params), dims=L.dims(params),
        frozen_params=L.frozen_numel(params),
        forward_seconds=device.compute_seconds(fwd) + st.moved["fwd"].get(name, 0) / bw,
        backward_seconds=device.compute_seconds(bwd) + st.moved["bwd"].get(name, 0) / bw,
        activation_bytes=st.acts.get(name, 0),
        workspace_bytes=_workspace(name, params, st),
        outside_workspace_bytes=outside_workspace(st.outside_largest.get(name, 0)) if name != L.ROOT else 0,
        forward_peak_bytes=st.forward_peak.get(name, 0) if name != L.ROOT else 0,
        checkpointed_forward_bytes=st.forward_nosave.get(name, 0) if name != L.ROOT else 0,
        exit_bytes=st.exit.get(name, 0) if name != L.ROOT else 0, output_bytes=st.output.get(name, 0),
        recall_workspace_bytes=st.recall.get(name, 0) if st.calls.get(name, 1) > 1 else 0,
        bucketed_workspace_bytes=st.bucketed.get(name, 0) if name != L.ROOT else 0,
        **dict(zip(("selective_saved_bytes", "selective_outside_input_bytes", "selective_forward_bytes",
                    "selective_recompute_seconds"), _selective(name, st.sac[Checkpoint.SELECTIVE], device))),
        selective_all=_selective(name, st.sac[Checkpoint.SELECTIVE_ALL], device),
        input_bytes=st.inputs.get(name, 0), entry_bytes=st.entry.get(name, 0), outside_bytes=st.outside.get(name, 0),
        **_code_held(name, st),
        outside_kept_bytes=st.outside_kept.get(name, 0), input_saved_bytes=st.input_saved.get(name, 0),
        input_saved_before_bytes=st.input_saved_before.get(name, 0),
        input_saved_outside_bytes=st.input_saved_outside.get(name, 0), calls=max(1, st.calls.get(name, 1)),
        forward_flops=fwd,
        backward_flops=bwd,
        forward_moved_bytes=st.moved["fwd"].get(name, 0), backward_moved_bytes=st.moved["bwd"].get(name, 0),
        children=kids)


def _selective(name: str, sc: _Sac, device: DeviceSpec) -> tuple:
    """(saved bytes, outside input bytes, forward bytes, recompute seconds) of one policy."""
    return (sc.saved.get(name, 0), sc.outside.get(name, 0), sc.forward.get(name, 0) if name != L.ROOT else 0,
            device.compute_seconds(dict(sc.flops.get(name, {}))) + sc.moved.get(name, 0) / device.memory_bandwidth)


def _code_held(name: str, st: _Stats) -> dict:
    """`LayerProfile.code_held` and `code_held_bytes` ([Note: outputs the caller's code holds])."""
    if st.held is None:
        return {}
    per, always = code_held(st.held, st.out_status.status, name, st.final)
    return {"code_held": per, "code_held_bytes": always}


# [Note: a repeated layer between other layers]
# A module called again after another layer ran (`layers = [L0, L1, L0, L1]`: one object at
# two places, [Note: one layer object at two places] in profile/layers.py) cannot be a layer of
# the chain of units: its backward runs at each call's place, around the layers between, which
# a unit before or after them cannot express (an auto plan that checkpointed L0 as a unit of its
# own was 22% under its verified peak, L1's activations live through L0's second backward). Its
# parameters go to the root, its work to the layer before it (`_fold`), as code between layers:
# an upper bound (+15% on full_shard), where ALBERT's block, called n times in a row, is one
# layer ([Note: repeated modules] in plan/units.py).


def _unique(params) -> list[nn.Parameter]:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def trace_profile(model: nn.Module, example_inputs: Sequence[Any], *, name: str, device: DeviceSpec,
                  layers: Sequence[str] | None = None, compute_dtype: str = "float32") -> Profile:
    """Profile `model(*example_inputs)` (the scalar loss) on fake tensors, layer by layer.

    The model may live on the meta device; neither it nor the inputs are changed."""
    if compute_dtype not in DTYPES:
        raise UsageError(f"unknown compute dtype {compute_dtype!r}: accepted {', '.join(DTYPES)}")
    inputs = tuple(example_inputs)
    names = [n for n in L.candidates(model, layers) if n != L.ROOT]
    children = {n: L.param_children(model, n) for n in names}
    stacks = _stacks(model, names)
    traced = [n for n in names if not _untraced(n, stacks)]
    with _Truncated(model, stacks):
        tracer = _run(model, inputs, traced, {n: children[n] for n in traced}, DTYPES[compute_dtype])
    _expand(tracer, names, [c for cs in children.values() for c in cs], stacks)
    # [Note: a repeated layer between other layers]
    ran = [n for n in tracer.ran if tracer.sequence.count(n) < 2]
    asg = L.assign(model, names, ran)
    _fold(tracer.stats, tracer.ran, asg.layers)
    tracer.stats.final = set(asg.layers)
    out = []
    for n in asg.layers:
        kids = children.get(n, [])
        kids = [c for c in tracer.kids_ran if c in kids] if all(c in tracer.kids_ran for c in kids) else []
        if tracer.stats.calls.get(n, 1) > 1:  # [Note: repeated modules]: never split into children
            kids = []
        if any(c in tracer.stats.aliased for c in kids):  # [Note: inputs passed twice]: a child as a unit
            kids = []  # of its own would get each argument wrapped apart by FSDP2, another program
        kid_profiles = tuple(_layer(c, _unique(model.get_submodule(c).parameters()), tracer.stats, device)
                             for c in kids)
        out.append(_layer(n, asg.params[n], tracer.stats, device, kid_profiles))
    from shardsched.profile.measure import batch_and_seq, inputs_extra
    micro_batch, seq = batch_and_seq(inputs)
    return Profile(model=name, layers=tuple(out), fingerprint=fingerprint(model), compute_dtype=compute_dtype,
                   micro_batch=micro_batch, seq=seq, input_bytes=sum(_nbytes([t]) for t in L.tensors_in(inputs)),
                   source="traced", tied=asg.tied, root_tied_numel=asg.root_tied_numel,
                   buffer_bytes=L.buffer_bytes(model),
                   extra={"device": device.name, "torch": torch.__version__,
                          **L.notes_extra(model), **inputs_extra(inputs)})
