"""Backward workspace per layer, measured: the bytes a layer's backward allocates on top
of what the memory model already counts (`LayerProfile.workspace_bytes`).

[Note: what the backward workspace is]
`sim.memory._backward` puts a unit's backward peak at max(its activations, its unsharded
gradients) plus `workspace_bytes`, on top of everything persistent and the earlier units'
retained activations. So each layer's backward is watched in a window and its peak taken
above the live bytes at the window's start less the gradient flowing into it (which no
other term counts). Activations freed while the backward runs lower the live bytes as
they do in FSDP2, and the weight gradients it produces raise them; `above_model` then
takes off the part of the peak that the simulator's max(activations, gradients) already
counts, so the simulator's peak is the real one (gelu-4x128 fp32: the 1.5 MiB at a
block's first backward op, FSDPMemTracker's figure; tests/plan/test_memory_levers.py).
Each window runs from the first gradient w.r.t. the module's outputs to the gradients w.r.t.
all its inputs (`watch_backward`, [Note: backward windows without full backward hooks]).
Code that runs outside every layer (a loss or a tied LM head after the last layer, folded
into a layer's activations by the profilers, `LayerProfile.outside_bytes`) runs its
backward outside every window: charging it to the next window in backward order (tried)
put a tied head's loss backward, its weight-gradient accumulation and whatever the model
returned on top of the first layer's own peak (HF GPT-2 at seq 1024: +15..23%). Its
transient is taken as the old guess instead, two of the largest tensor it saved
(`outside_workspace`: cross-entropy's gradients of its (T, vocab) inputs; exact there).
The old guess is a floor: the code's backward is also watched as a window of its own, from
`backward_starts` to the first layer window ([Note: the loss's backward window]).
A layer none of whose inputs needs a gradient (the embedding) has no input gradient to close
its window. Where another layer's window opens after it, it is closed as it stood once every
parameter under it had its gradient accumulated, which is when the runtime reshards such a unit
([Note: a unit whose inputs need no gradient] in runtime/own_backward.py; open until backward
ended, a text tower's embedding after a vision tower took the vision tower's backward into its
workspace, +8.4%); otherwise (an LM's embeddings, first in forward) when backward ends.
Live bytes are counted as PyTorch's `torch.distributed._tools.mem_tracker.MemTracker`
does: every storage an op produces, once, released by a weakref finalizer; that works on
real and fake tensors alike.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.nn.modules._functions import BackwardHookFunction
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from shardsched.profile.layers import in_forward

# [Note: backward windows without full backward hooks]
# `register_full_backward_(pre_)hook` wraps a module's inputs and outputs in
# `BackwardHookFunction`, whose outputs are views; a model that then modifies one in place
# (Falcon's `mlp_output += attention_output`, ResNet's `hidden_state += residual`, any
# `nn.ReLU(inplace=True)` on a module's output) fails with "Output 0 of
# BackwardHookFunction is a view and is being modified inplace" (autograd's rule for views
# made by custom Functions). It also keeps the gradients w.r.t. the outputs alive until
# the module's input gradients are ready (`BackwardHook.grad_outputs`), which FSDP2 does not:
# an extra (T, h) gradient in a block's window (gelu 2x128 full_shard: +0.77%, now -0.00%).
# So a window opens by a gradient hook on the outputs themselves (the first of them to get its
# gradient, as FSDP2 finds its own pre-backward with `register_multi_grad_hook` mode "any",
# torch/distributed/fsdp/_fully_shard/_fsdp_state.py; `_on_first_grad`): outputs are not wrapped, so in-place ops on them see the model's own
# tensors. It closes when the gradients w.r.t. all the module's inputs that need one are
# ready (mode "all" on the inputs passed through one `BackwardHookFunction`, the identity a
# full backward hook puts there, so they are the module's own input gradients, before other
# users of the same tensors add theirs). A module that modifies its own input in place fails
# as it did with full backward hooks. A module none of whose inputs needs a gradient (the
# embedding: integer tokens) never closes its window; the caller closes it when backward ends.


# [Note: inputs passed twice]
# A module called with one tensor at several arguments (`self_attn(x, x, x)` in
# nn.TransformerEncoderLayer) tests their identity: `F.multi_head_attention_forward` projects
# q, k and v with one packed Linear when `query is key is value` (one saved input, one (T, 3h)
# storage) and with three Linears otherwise (three copies of a transposed input saved). So the
# window's identity keeps them one object: passing each argument through its own output of
# `BackwardHookFunction` made the trace take the three-Linear path the verified run (whose unit
# is the whole block) does not: a ViT of such layers was predicted 9.7% over (two (B, T, h) a
# block). FSDP2 wraps a unit's inputs one by one (`RegisterPostBackwardFunction`), so a plan
# that made the attention module a unit of its own took the three-Linear path there (an auto
# plan splitting a post-norm layer into its children: 22% under its verified peak): a layer
# with a child given one tensor at two arguments is never split into its children
# (`Stats.aliased`, `trace_profile`), and a layer so called is joined into its caller
# (`profile.escapes.join_aliased`). Both read one test, `escapes.given_twice` (one floating
# tensor, whether or not it needs a gradient: `measure`'s pass runs under no_grad).


def _wrap_inputs(args, kwargs, end):
    """(args, kwargs) with the tensors that need a gradient passed through one
    `BackwardHookFunction` (the identity a full backward hook puts on inputs), and `end`
    hooked on their gradients: those are the gradients w.r.t. the module's own inputs,
    before they are summed with those of other users of the same tensors."""
    flat, spec = tree_flatten((args, kwargs))
    idx = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not idx or not torch.is_grad_enabled():
        return None
    slot: dict[int, int] = {}  # one wrapped tensor per distinct input: [Note: inputs passed twice]
    for i in idx:
        slot.setdefault(id(flat[i]), len(slot))
    distinct = list({id(flat[i]): flat[i] for i in idx}.values())
    wrapped = BackwardHookFunction.apply(*distinct)
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    for i in idx:
        flat[i] = wrapped[slot[id(flat[i])]]
    register_multi_grad_hook(wrapped, end, mode="all")
    return tree_unflatten(flat, spec)


def _on_first_grad(outs: list[torch.Tensor], start) -> None:
    """`start(grad)` once, at the first gradient w.r.t. one of `outs`: `register_multi_grad_hook`
    in mode "any", without its cycle. Its hook holds the list of the nodes it hooks, so a node
    whose backward never runs (a checkpointed region's original one) stayed alive, its saved
    tensors with it, until Python's garbage collector ran: the trace's windows then depended
    on when that was ([Note: a checkpoint inside the model] in profile/trace_fake.py)."""
    fired: list[bool] = []

    def first(grad) -> None:
        if not fired:
            fired.append(True)
            start(grad)
    for t in outs:
        t.register_hook(first)


def watch_backward(module: nn.Module, start, end, inputless=lambda: None) -> list:
    """Call `start(grad)` when the first gradient w.r.t. one of `module`'s outputs is ready
    and `end(grads)` when those w.r.t. all its inputs are, on every forward that records a graph
    ([Note: backward windows without full backward hooks]); `inputless()` on a forward none of
    whose inputs needs a gradient (no `end` then). Returns the hook handles."""
    def pre(m, args, kwargs):
        wrapped = _wrap_inputs(args, kwargs, end)
        if wrapped is None and torch.is_grad_enabled():
            inputless()
        return wrapped

    def post(m, args, kwargs, out):
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs and torch.is_grad_enabled():
            _on_first_grad(outs, start)

    return [module.register_forward_pre_hook(in_forward(pre), with_kwargs=True),
            module.register_forward_hook(in_forward(post), with_kwargs=True)]


# [Note: forward windows]
# A layer's forward peaks above what it keeps: the tensor being produced next to its inputs
# and what it saved (an MLP's up-projection output next to its activation's, both live
# while the activation runs). The same mode watches each layer's forward from its pre-hook
# to its hook; `plan.units.layer_bytes` takes the part above its saved activations as the
# transient. A checkpointed layer's forward saves nothing, so the profilers watch a second
# forward under `no_grad` the same way (`trace._forward_without_saving`): what lives then is
# only what the data flow holds (an MLP's up-projection output next to its activation's).
# The guess they replace, half the backward workspace, was 2x short on a Mixer's
# checkpointed MLP (auto plans over budget by up to 7%).


# [Note: exit windows]
# After a unit's forward, the code up to the next unit's pre-forward runs with the unit's
# AllGather output still held (FSDP2 frees it at the next copy-out): a residual add after a
# partitioned block's last child, a pooling, the loss after the last layer. What that code
# holds beyond what is saved (the child's output next to the sum) is a moment of its own; a
# Mixer block split into its children was 2% over its budget without it. The window opens at
# a module's forward hook and closes at the next tracked module's pre-hook (or when forward
# ends: the loss), so a last child's window spans its parent's code after it and the gap after
# the parent. It records its peak of live bytes less everything saved when it closes (autograd
# packs an op's output only after the op returns, so the live bytes at the op's end already
# hold what it is about to save); `sim.memory` adds everything saved through the unit back.


# [Note: bucketed windows]
# DDP copies each parameter's gradient into its bucket as autograd accumulates it and frees
# it (`gradient_as_bucket_view`), so its backward never holds a layer's gradients at once, as
# FSDP2's unsharded ones are. Each backward window also records its peak of live bytes less
# the parameters' gradients accumulated by then (a post-accumulate-grad hook per parameter):
# the produced gradient is counted while the op that made it is live, not after
# (`LayerProfile.bucketed_workspace_bytes`, read for plans that run on DDP in `sim.memory`).


# [Note: gradients held beside a window]
# Autograd holds gradients that flow around a module while its backward runs. In a block split
# into its children, `x = x + mlp(norm(x))`, the gradient w.r.t. the block's output waits, while
# norm's backward runs, to be summed with norm's input gradient (the residual branch); in a
# U-Net the gradient w.r.t. an encoder's output from its skip connection waits through every
# decoder and encoder after it. Such a tensor is neither the window's incoming gradient (the
# base takes that off) nor anything the memory model counts (saved activations, parameters'
# gradients), so each window also measures the gradients in flight as it opens: live bytes
# less its incoming gradient, the saved storages still alive, the parameters' gradients
# accumulated, and those produced but still waiting for their AccumulateGrad (a repeated
# module's, a tied weight's: the memory model counts them as the unit's gradients). What is in
# flight above the parent's opening (a layer: above the first window's, where the loss's and
# a tied head's gradients already are) counts in the window's workspace. A Mixer split into
# children ran one (B, T, C) gradient above its predicted peak, over its auto budget; a U-Net's
# backward moments were 25-40% under.


# [Note: the root's backward tail]
# What runs in backward after the last layer window closes is the root module's own
# backward: the embedding lookup of a model whose embedding the root unit holds (a tied
# embedding), its weight gradient accumulated into the root's. That window's base already
# holds the root's gradient (the tied head's, produced at the start of backward), so its
# peak above the base is exactly what the root unit's backward step adds on top of its
# gradients (`sim.memory._backward`): a new (vocab, hidden) gradient and the sum, two
# of them (an LM with a 64k vocabulary was 17% under without it). The base leaves out the
# gradient the root's code receives (w.r.t. the first layer's inputs: freed as the lookup's
# backward runs, and not a term of the root's moment) and the peak leaves out the parameters'
# gradients accumulated in the tail (a position embedding's: the root's gradients count them);
# with both in, a tied LM with learned positions ran one (T, hidden) above its budget.
# Kept under ROOT_TAIL.
ROOT_TAIL = "<root-tail>"
# A model with no layer at all (each candidate called again after another ran) is the root's
# code from its loss to its first op: its whole backward is the loss's window, still open when
# backward ends, and that window is the root's (an autoencoder encoding two views was 16% over
# its verified peak with half its activations standing for it).


def _log_peak(log, left_out=frozenset()) -> int:
    """The most a window's event log (allocations +, frees -) held above its start, the storages
    `left_out` (by key) not counted."""
    running = peak = 0
    for key, delta in log:
        if key not in left_out:
            running += delta
            peak = max(peak, running)
    return peak


# [Note: the loss's backward window]
# The code after the last layer (the loss, a scale, a boolean mask) runs its backward first,
# before any layer window opens. "Two of its largest saved tensor" is exact for cross-entropy
# over (T, vocab) logits, and short where that code does more: a 0-dim `logit_scale` in front
# of a masked loss holds the (M, vocab) gradient of the selection, the (T, vocab) one of the
# logits the index's backward scatters it into, and the product the scale's gradient reduces
# (a frozen GRU LM was 3.7% under its verified peak). So the window is measured too: live
# bytes from the start of backward until the first layer window opens, every free counted
# (the code's saved tensors go as its backward runs, and the memory model has them all live
# at that moment), less what it produced that is still alive when the window closes other
# than the gradient flowing into the layer: gradients in flight (a tied head's weight
# gradient waiting for the embedding's, a root parameter's accumulated one), which the
# layer windows and the root's gradients count ([Note: gradients held beside a window]).
# Measured from the event log of the window, so a tensor left out is left out from its
# allocation on. `outside_workspace` takes the larger of this and the old guess.


class BackwardWorkspace(TorchDispatchMode):
    """Enter it around forward and backward; `workspace[name]` then holds each hooked
    module's backward workspace in bytes ([Note: what the backward workspace is])."""

    def __init__(self, model: nn.Module, layers: list[str], children: list[str], *, persistent=(),
                 parents: dict[str, str] | None = None, params: dict[str, list[torch.Tensor]] | None = None):
        super().__init__()
        self.live = 0
        # [Note: gradients held beside a window]
        self.saved_live = 0  # bytes of saved storages not yet freed
        self._parents = parents or {}  # child -> the layer it splits
        self._params = params or {}  # module -> the parameters autograd accumulates into
        self._pending: dict[int, int] = {}  # parameters whose gradient is produced, not yet accumulated
        self._accumulated_ids: set[int] = set()
        self._flight0: int | None = None  # in flight as the first window opens
        self.handles = []
        self.grads = 0  # parameters' gradients accumulated so far ([Note: bucketed windows])
        self._grad_storages = WeakIdKeyDictionary()
        self.bucketed: dict[str, int] = {}
        """Per module, its backward windows with each parameter's gradient gone once it is
        accumulated, as DDP copies it into its bucket ([Note: bucketed windows])."""
        self._seen = WeakIdKeyDictionary()
        # Parameters, buffers and inputs are not allocations of the step: ops return views
        # of them (a weight's transpose), whose storage must not count when first seen.
        for t in persistent:
            self._seen[t.untyped_storage()] = 0
            if t.requires_grad:
                self.handles.append(t.register_post_accumulate_grad_hook(self._accumulated))
        self._inputless: set[str] = set()  # modules none of whose inputs needed a gradient
        self._done: dict[str, list[int]] = {}  # their windows once their gradients are in
        self._open: dict[str, list[int]] = {}  # name -> [base, peak]
        self._tail: list[int] | None = None  # [base, peak] once every window has closed
        self.workspace: dict[str, int] = {}
        self.recall: dict[str, int] = {}
        """Per repeated module, the most its backward windows after the first held."""
        self.flight: dict[str, int] = {}
        """Per module, the gradients in flight beside it as its backward starts ([Note: gradients
        held beside a window]): live at its backward's pre-hook, as FSDP2 gathers it again."""
        self.backward = False  # the loss is computed
        self.forward_top = 0
        """The most live in forward (a model with no layer: the root's forward moment)."""
        self._closed: dict[str, int] = {}
        self._fopen: dict[str, list[int]] = {}  # forward windows: name -> [base, peak, peak at its last save]
        self.forward: dict[str, int] = {}
        """Per module, the peak of its forward above the live bytes at its start: its output,
        what it saves and the transients beside them ([Note: forward windows])."""
        self.recompute: dict[str, int] = {}
        """Per module, that peak as of the last tensor its forward saved for backward: what its
        recomputation holds (`LayerProfile.recompute_peak_bytes`)."""
        self.saved = 0
        """Bytes of the distinct storages saved for backward so far: the profiler's
        `saved_tensors_hooks` pack adds to it (`note_saved`)."""
        self._gaps: dict[str, int] = {}  # exit windows: name -> peak of live
        self.exit: dict[str, int] = {}
        """Per module, the most the code after it holds that nothing saved ([Note: exit
        windows])."""
        self._keys = WeakIdKeyDictionary()  # storage made in the loss's window -> its number in the log
        self._log: list[tuple[int, int]] | None = None  # (storage key, +/- bytes) while the window is open
        self.loss_window: dict[str, int] = {}
        """The layer whose window opened first in backward -> the peak of the code after it, its
        backward run before ([Note: the loss's backward window])."""
        for name in [*(n for n in layers if n), *children]:
            self._attach(model.get_submodule(name), name)

    def _track(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st in self._seen:
            return
        nbytes = st.nbytes()
        self._seen[st] = nbytes
        self.live += nbytes
        if not self.backward:
            self.forward_top = max(self.forward_top, self.live)
        key = 0  # only what the loss's window makes is named: its frees of older storages just count
        if self._log is not None:
            key = self._keys[st] = len(self._log) + 1
            self._log.append((key, nbytes))
        weakref.finalize(st, self._free, nbytes, key)

    def _free(self, nbytes: int, key: int = 0) -> None:
        self.live -= nbytes
        if self._log is not None:
            self._log.append((key, -nbytes))

    def backward_starts(self) -> None:
        """The loss is computed and backward begins: open the loss's window ([Note: the loss's
        backward window]); the first layer window to open closes it."""
        self.close_exits()
        self._log = []
        self.backward = True

    def _close_loss_window(self, name: str, grad) -> None:
        log, self._log = self._log, None
        made = {k for k, d in log if d > 0}
        alive = made - {k for k, d in log if d < 0 and k}
        incoming = {self._keys.get(g.untyped_storage(), 0) for g in [grad] if isinstance(g, torch.Tensor)}
        left_out = alive - incoming  # gradients in flight: counted where they wait
        self.loss_window[self._parents.get(name, name)] = _log_peak(log, left_out)

    @property
    def accumulated_ids(self) -> set[int]:
        """ids of the persistent tensors whose gradient autograd has stored so far."""
        return self._accumulated_ids

    def _accumulated(self, param: torch.Tensor) -> None:
        """A parameter's gradient is in `.grad` (its first one stored, later ones added in)."""
        self._accumulated_ids.add(id(param))
        self._pending.pop(id(param), None)
        st = param.grad.untyped_storage() if param.grad is not None else None
        if st is not None and st not in self._grad_storages:
            self._grad_storages[st] = True
            self.grads += self._seen.get(st, 0)
        for name in [n for n in self._open if n in self._inputless and self._params.get(n) and n not in self._done]:
            if all(id(p) in self._accumulated_ids for p in self._params[name]):
                self._done[name] = list(self._open[name])  # closed as it stands if another layer's window opens

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self._track(t)
        for window in [*self._open.values(), *self._fopen.values()]:
            window[1] = max(window[1], self.live)
        for window in self._open.values():
            window[3] = max(window[3], self.live - self.grads)
        for name, peak in self._gaps.items():
            self._gaps[name] = max(peak, self.live)
        if self._tail is not None:
            self._tail[1] = max(self._tail[1], self.live - self.grads)
        return out

    def _incoming(self, grads) -> int:
        """Bytes of the distinct tracked storages among `grads`."""
        sts = {id(st): st for g in grads if isinstance(g, torch.Tensor)
               for st in [g.untyped_storage()] if st in self._seen}
        return sum(self._seen[st] for st in sts.values())

    def _attach(self, module: nn.Module, name: str) -> None:
        def start(grad):
            if self._log is not None:
                self._close_loss_window(name, grad)
            for done, window in self._done.items():  # [Note: what the backward workspace is]
                if done in self._open:
                    self._open[done] = window
                    self._close(done)
            self._done.clear()
            base = self.live - self._incoming([grad])
            flight = base - self.saved_live - self.grads - sum(self._pending.values())
            held = self._held(name, flight)
            self.flight[name] = max(self.flight.get(name, 0), held)
            self._open[name] = [base - held, self.live, base - held - self.grads, self.live - self.grads, flight]
            self._tail = None  # code between two layers' backward: not the root's tail

        def end(grads=()):
            if name in self._open:
                self._close(name, grads)

        self.handles += watch_backward(module, start, end, inputless=lambda: self._inputless.add(name))

        def fwd_pre(m, args):
            self.close_exits()  # the next module starts: the code between ends
            self._fopen[name] = [self.live, self.live, self.live]

        def fwd_post(m, args, out):
            base, peak, saved = self._fopen.pop(name, (self.live, self.live, self.live))
            self.forward[name] = max(self.forward.get(name, 0), peak - base)
            self.recompute[name] = max(self.recompute.get(name, 0), saved - base)
            self._gaps[name] = self.live

        self.handles += [module.register_forward_pre_hook(in_forward(fwd_pre)),
                         module.register_forward_hook(in_forward(fwd_post))]

    def note_saved(self, nbytes: int, storage=None) -> None:
        """A storage saved for backward for the first time (the profiler's pack hook); with
        `storage`, it counts in `saved_live` until it is freed."""
        self.saved += nbytes
        for window in self._fopen.values():  # `LayerProfile.recompute_peak_bytes`
            window[2] = window[1]
        if storage is not None:
            self.saved_live += nbytes
            weakref.finalize(storage, self._unsave, nbytes)

    def _unsave(self, nbytes: int) -> None:
        self.saved_live -= nbytes

    def _held(self, name: str, flight: int) -> int:
        """Gradients in flight as a module's backward starts beyond those as its parent's
        started (a layer: as the first window opened) ([Note: gradients held beside a
        window]); 0 for a repeated module's later calls (their buffered gradients are `recall`'s)."""
        if self._flight0 is None:
            self._flight0 = flight
        parent = self._open.get(self._parents.get(name, ""))
        if self._closed.get(name, 0) or (name in self._parents and parent is None):
            return 0
        return max(0, flight - (parent[4] if parent is not None else self._flight0))

    def close_exits(self) -> None:
        """End the exit windows: the next module starts, or forward is over."""
        for name, peak in self._gaps.items():  # everything saved by now is counted apart
            self.exit[name] = max(self.exit.get(name, 0), peak - self.saved)
        self._gaps.clear()

    def _close(self, name: str, grads=()) -> None:
        base, peak, nbase, npeak, _ = self._open.pop(name)
        self.workspace[name] = max(self.workspace.get(name, 0), peak - base)
        self.bucketed[name] = max(self.bucketed.get(name, 0), npeak - nbase)
        self._closed[name] = self._closed.get(name, 0) + 1
        for p in self._params.get(name, ()):  # its gradients now wait in autograd for their AccumulateGrad
            if id(p) not in self._accumulated_ids:
                self._pending[id(p)] = p.numel() * p.element_size()
        if self._closed[name] > 1:  # a repeated module's later call ([Note: a repeated module's later calls])
            self.recall[name] = max(self.recall.get(name, 0), peak - base)
        if not self._open:  # the root's code runs next: its base is without the gradients it receives
            base = self.live - self._incoming(grads) - self.grads
            self._tail = [base, base]

    def finish(self) -> dict[str, int]:
        """Close the windows still open (layers without input gradients); remove the hooks."""
        tail = self._tail
        if self._log is not None:  # no layer window opened: the root's code ran all of backward
            self.workspace[ROOT_TAIL] = max(self.workspace.get(ROOT_TAIL, 0), _log_peak(self._log))
        self._log = None
        for name in list(self._open):
            self._close(name)
        if tail is not None:  # [Note: the root's backward tail]
            self.workspace[ROOT_TAIL] = tail[1] - tail[0]
        for h in self.handles:
            h.remove()
        self.handles = []
        return self.workspace
