"""Measured profiles: per-layer parameters, forward/backward seconds, saved activations
and backward workspace (`profile.workspace`).

Everything is taken with module hooks on an unmodified model, so any
`(model, example_inputs)` whose `model(*inputs)` returns the loss can be
profiled, not only our GPT.

[Note: measured times, traced bytes]
`--measure` (`profile.resolve.measured`) keeps only the times of this measurement: every
byte comes from the fake-tensor trace of the same model and inputs (`with_traced_memory`),
which runs no kernel and records what the hooks here cannot see (exit windows, entry and
output bytes, the selective-checkpointing fields: [Note: exit windows] in
profile/workspace.py). So a measured and a traced profile of one model predict the same
memory, and auto offers selective checkpointing on both. The seconds of the ops a selective
layer recomputes are the measured forward times the fraction the trace prices them at
(on this machine's preset). A model fake tensors cannot run is traced on real copies
([Note: a trace on real tensors] in profile/trace_fake.py); a model that trace refuses too
keeps the bytes measured here, and those fields stay unknown. `measure_profile` itself still
measures bytes by running the model: the tests hold the trace to it.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections import defaultdict
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn as nn

from shardsched.errors import UsageError
from shardsched.profile import layers as L
from shardsched.profile.escapes import Escapes, given_twice, owners, settled_layers
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.types import LayerProfile, Profile
from shardsched.profile.trace_record import loss_bytes
from shardsched.profile.workspace import ROOT_TAIL, BackwardWorkspace, watch_backward
from shardsched.profile.workspace_terms import layer_workspace, outside_workspace

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------- layers

def _run_order(model: nn.Module, names: list[str], inputs: tuple) -> tuple[list[str], Escapes]:
    """Layers whose forward ran, in the order they first started, and the parameters read
    outside their layer ([Note: a parameter used outside its layer] in profile/escapes.py):
    one no-grad forward."""
    modules = dict(model.named_modules())
    parent = {c: n for n in names for c in L.param_children(model, n)}
    first: list[str] = []
    running: list[str] = []

    def enter(name: str):
        def hook(module, args, kwargs) -> None:  # must return None: a value would replace the inputs
            running.append(name)
            if name not in first and name not in parent:
                first.append(name)
            if name not in parent and given_twice(args, kwargs):  # [Note: inputs passed twice]
                watch.aliased.add(name)
        return hook

    def leave(module, args, out) -> None:
        running.pop()

    handles = [h for n in [*names, *parent] for h in (modules[n].register_forward_pre_hook(enter(n), with_kwargs=True),
                                                      modules[n].register_forward_hook(leave))]
    watch = Escapes(owners(model, [*names, *parent]), lambda: running, parent)
    try:
        with torch.no_grad(), watch:
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return first, watch


def assignment(model: nn.Module, inputs: tuple, layers: Sequence[str] | None = None) -> L.Assignment:
    """Layers (given, `model.layer_names()` or discovered; profile.layers) in execution order,
    owners of params; none holds a parameter read outside it (`escapes.settled_layers`)."""
    order: dict[str, list[str]] = {}

    def run(names: list[str]) -> Escapes:
        order["first"], seen = _run_order(model, names, inputs)
        return seen

    names, seen = settled_layers(model, [n for n in L.candidates(model, layers) if n != L.ROOT], run)
    return L.assign(model, names, order["first"])._replace(whole=frozenset(seen.kids))


def resolve_layers(model: nn.Module, inputs: tuple, layers: Sequence[str] | None = None) -> list[str]:
    """Layer paths in execution order, the root "" first when it owns parameters."""
    return assignment(model, inputs, layers).layers


# ---------------------------------------------------------------- hooks

class _Hooks:
    """Forward/backward timing and "who is running now" for layers and their children.

    Forward time of a module: forward pre-hook to forward hook. Backward time: the
    first gradient w.r.t. its outputs to the gradients w.r.t. all its inputs
    (`workspace.watch_backward`: gradient hooks, not full backward hooks, which break
    models that modify a module's output in place). A module none of whose inputs
    needs a gradient (the embedding: integer tokens) has no end; its backward is
    timed until `loss.backward()` returns instead, which is right for the first
    layer, the last to run in backward.
    """

    def __init__(self, model: nn.Module, layers: list[str], children: dict[str, list[str]]):
        self.layers, self.children = layers, children
        self.layer_set = set(layers)
        self.parent = {c: layer for layer, cs in children.items() for c in cs}
        self.first_seen: dict[str, int] = {}
        self.input_bytes: dict[str, int] = {}
        self.handles = []
        self.first_layer = next((n for n in layers if n), layers[0])
        for name in [n for n in layers if n] + list(self.parent):
            self._attach(model.get_submodule(name), name)
        self.reset()

    def reset(self) -> None:
        self.stack: list[tuple[str, float]] = []
        self.last_layer: str | None = None
        self.last_kid: dict[str, str] = {}  # per layer, its child that ran last in its current call
        self.fwd: dict[str, float] = defaultdict(float)
        self.bwd: dict[str, float] = defaultdict(float)
        self.bwd_starts: dict[str, list[float]] = defaultdict(list)

    def _attach(self, module: nn.Module, name: str) -> None:
        def pre(m, args):
            # What a checkpointed layer keeps: its floating inputs (integer tokens are example inputs).
            self.input_bytes[name] = sum(t.nbytes for t in L.tensors_in(args) if t.is_floating_point())
            self.first_seen.setdefault(name, len(self.first_seen))
            if name in self.layer_set:
                self.last_layer = name
                self.last_kid.pop(name, None)
            elif name in self.parent:
                self.last_kid[self.parent[name]] = name
            self.stack.append((name, time.perf_counter()))

        def post(m, args, out):
            popped, t0 = self.stack.pop()
            self.fwd[popped] += time.perf_counter() - t0

        def bwd_start(grad):
            self.bwd_starts[name].append(time.perf_counter())

        def bwd_end(grads=()):
            if self.bwd_starts[name]:
                self.bwd[name] += time.perf_counter() - self.bwd_starts[name].pop()

        self.handles += [module.register_forward_pre_hook(L.in_forward(pre)),
                         module.register_forward_hook(L.in_forward(post)),
                         *watch_backward(module, bwd_start, bwd_end)]

    def finish_backward(self, end: float) -> None:
        """Windows still open (no input needed a gradient) end with the backward."""
        for name, starts in self.bwd_starts.items():
            self.bwd[name] += sum(end - t0 for t0 in starts)
        self.bwd_starts = defaultdict(list)

    def current(self) -> tuple[str, str | None]:
        """(layer, child) running now. Outside every layer (parameter-free code
        between layers, e.g. a ReLU in a Sequential) counts for the layer that
        ran last, or the first layer before any ran: its output feeds the next
        layer but it is allocated in the previous one's wake."""
        layer = next((n for n, _ in reversed(self.stack) if n in self.layer_set), None)
        layer = layer or self.last_layer or self.first_layer
        child = next((n for n, _ in reversed(self.stack) if self.parent.get(n) == layer), None)
        return layer, child

    def after_child(self) -> str | None:
        """The child whose outside code runs now: the layer's own code after one of its
        children ran in this call ([Note: the parent's own code in a partition] in plan/units.py)."""
        layer, child = self.current()
        running = any(n == layer for n, _ in self.stack)
        return self.last_kid.get(layer) if running and child is None else None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------- passes

def _loss(out: Any) -> torch.Tensor:
    from shardsched.models.spec import picked_loss
    out = picked_loss(out)
    if not isinstance(out, torch.Tensor):
        raise UsageError(f"model(*example_inputs) must return the loss as a tensor, got {type(out).__name__}")
    return out if out.dim() == 0 else out.sum()


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data_ptr, nbytes) of the tensor's storage, or None for storage-less tensors."""
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError):
        return None


class _Memory(NamedTuple):
    """Bytes per layer (and child) from one forward and backward."""

    acts: dict[str, int]
    outside: dict[str, int]
    """Of `acts`, saved by code outside every layer (`LayerProfile.outside_bytes`)."""
    outside_largest: dict[str, int]
    """The largest tensor that outside code saved."""
    workspace: dict[str, int]
    loss_window: dict[str, int]
    """The code after the last layer, its backward as measured ([Note: the loss's backward window])."""
    loss_bytes: int = 8
    """`Profile.loss_bytes`, as the real loss held it."""


def _measure_memory(model: nn.Module, inputs: tuple, hooks: _Hooks, children: list[str]) -> _Memory:
    """One forward and backward. Activations: bytes of the storages saved for backward,
    attributed to the layer (and child) running when autograd saved them, each storage
    once; parameters and buffers are persistent state, and the example inputs are
    `input_bytes`, so none of them counts; of those, what code outside every layer saved
    (`LayerProfile.outside_bytes`). Workspace: each layer's and child's backward
    workspace (`profile.workspace`), the backward running under its live-bytes mode.
    Gradients are cleared before and after."""
    exclude = {_storage(t)[0] for t in [*model.parameters(), *model.buffers(), *L.tensors_in(inputs)]
               if _storage(t)}
    acts: dict[str, int] = defaultdict(int)
    outside: dict[str, int] = defaultdict(int)
    outside_largest: dict[str, int] = defaultdict(int)
    kept: list[torch.Tensor] = []  # keep saved storages alive: no address reuse while we dedupe

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = _storage(t)
        if st is None or st[0] in exclude or st[0] == 0:
            return t
        exclude.add(st[0])
        kept.append(t)
        layer, child = hooks.current()
        acts[layer] += st[1]
        if not any(n in hooks.layer_set for n, _ in hooks.stack):  # `LayerProfile.outside_bytes`
            outside[layer] += st[1]
            outside_largest[layer] = max(outside_largest[layer], st[1])
        if child is not None:
            acts[child] += st[1]
        elif (kid := hooks.after_child()) is not None:  # the parent's code: the child's outside code
            acts[kid] += st[1]
            outside[kid] += st[1]
            outside_largest[kid] = max(outside_largest[kid], st[1])
        return t

    for p in model.parameters():
        p.grad = None
    hooks.reset()
    params = {n: [p for p in model.get_submodule(n).parameters() if p.requires_grad]
              for n in [*hooks.layers, *children] if n}  # a window without input gradients closes on them
    ws = BackwardWorkspace(model, hooks.layers, children, params=params,
                           persistent=[*model.parameters(), *model.buffers(), *L.tensors_in(inputs)])
    try:
        with ws:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = _loss(model(*inputs))
            kept.clear()  # the graph holds what backward needs; activations must free as it runs
            held = loss_bytes(loss)
            ws.backward_starts()
            loss.backward()
            del loss
    finally:
        workspace = ws.finish()
        for p in model.parameters():
            p.grad = None
    return _Memory(acts, outside, outside_largest, workspace, ws.loss_window, held)


def _timed_steps(model: nn.Module, inputs: tuple, hooks: _Hooks, *, repeats: int, warmup: int):
    """Per-module forward and backward seconds: the minimum over `repeats` steps after
    `warmup` (the least disturbed run; a median still moves with the machine's load)."""
    fwd_runs, bwd_runs = defaultdict(list), defaultdict(list)
    for i in range(warmup + repeats):
        hooks.reset()
        loss = _loss(model(*inputs))
        loss.backward()
        hooks.finish_backward(time.perf_counter())
        for p in model.parameters():
            p.grad = None
        if i >= warmup:
            for name in hooks.first_seen:
                fwd_runs[name].append(hooks.fwd.get(name, 0.0))
                bwd_runs[name].append(hooks.bwd.get(name, 0.0))
    best = lambda runs: {n: stable(min(v)) for n, v in runs.items()}  # noqa: E731
    return best(fwd_runs), best(bwd_runs)


def stable(seconds: float, digits: int = 2) -> float:
    """Round to `digits` significant figures, so jitter below that cannot change a plan."""
    return float(f"{seconds:.{digits - 1}e}") if seconds > 0 else 0.0


def _in_dtype(model: nn.Module, inputs: tuple, compute_dtype: str) -> tuple[nn.Module, tuple]:
    """The model in the compute dtype: a converted copy if it differs, so the
    caller's model is never changed; floating inputs converted likewise."""
    if compute_dtype not in _DTYPES:
        raise UsageError(f"unknown compute dtype {compute_dtype!r}: accepted {', '.join(_DTYPES)}")
    dtype = _DTYPES[compute_dtype]
    floats = [p for p in model.parameters() if p.is_floating_point()]
    if all(p.dtype == dtype for p in floats):
        return model, inputs
    conv = lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
    return copy.deepcopy(model).to(dtype), tuple(conv(x) for x in inputs)


# ---------------------------------------------------------------- entry point

def measure_profile(model: nn.Module, example_inputs: Sequence[Any], *, name: str | None = None,
                    layers: Sequence[str] | None = None, repeats: int = 5, warmup: int = 2,
                    compute_dtype: str = "float32") -> Profile:
    """Profile `model` on `example_inputs` on this machine, layer by layer.

    `model(*example_inputs)` must return the loss (a scalar, or a tensor whose
    sum is the loss). Gradients the model had before are restored afterwards.
    `name` labels the profile and its plans (default: the model's class name).
    """
    name = name or type(model).__name__
    inputs = tuple(example_inputs)
    fp = fingerprint(model)
    run_model, run_inputs = _in_dtype(model, inputs, compute_dtype)
    asg = assignment(run_model, run_inputs, layers)
    names = asg.layers
    children = {n: [] if n in asg.whole else L.param_children(run_model, n) for n in names}
    saved_grads = {p: p.grad for p in run_model.parameters()}
    hooks = _Hooks(run_model, names, children)
    try:
        mem = _measure_memory(run_model, run_inputs, hooks, list(hooks.parent))
        fwd, bwd = _timed_steps(run_model, run_inputs, hooks, repeats=repeats, warmup=warmup)
    except UsageError:
        raise
    except Exception as e:  # the model's own code failed in forward or backward: one line, not a traceback
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot run the model's forward and backward to measure it ({type(e).__name__}: "
                         f"{msg[:200]})") from None
    finally:
        hooks.remove()
        for p, g in saved_grads.items():
            p.grad = g

    def lp(n: str, params: list, kids: tuple = ()) -> LayerProfile:
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        root = n == L.ROOT  # its workspace is its backward tail ([Note: the root's backward tail])
        return LayerProfile(name=n, params=sum(p.numel() for p in params), dims=L.dims(params),
                            frozen_params=L.frozen_numel(params),
                            forward_seconds=fwd.get(n, 0.0), backward_seconds=bwd.get(n, 0.0),
                            activation_bytes=mem.acts.get(n, 0),
                            workspace_bytes=mem.workspace.get(ROOT_TAIL, 0) if root else layer_workspace(
                                mem.workspace.get(n, 0), mem.acts.get(n, 0) - mem.outside.get(n, 0), grad_bytes),
                            outside_workspace_bytes=0 if root else outside_workspace(mem.outside_largest.get(n, 0),
                                                                                     mem.loss_window.get(n, 0)),
                            input_bytes=hooks.input_bytes.get(n, 0), outside_bytes=mem.outside.get(n, 0),
                            children=kids)

    order = lambda cs: sorted(cs, key=lambda c: hooks.first_seen.get(c, len(hooks.first_seen)))  # noqa: E731
    profiles = []
    for n in names:
        kids = tuple(lp(c, list({id(p): p for p in run_model.get_submodule(c).parameters()}.values()))
                     for c in order(children[n]))
        profiles.append(lp(n, asg.params[n], kids))
    micro_batch, seq = batch_and_seq(inputs)
    return Profile(model=name, layers=tuple(profiles), fingerprint=fp, compute_dtype=compute_dtype,
                   micro_batch=micro_batch, seq=seq, input_bytes=sum(t.nbytes for t in L.tensors_in(inputs)),
                   source="measured", tied=asg.tied, root_tied_numel=asg.root_tied_numel,
                   buffer_bytes=L.buffer_bytes(run_model), loss_bytes=mem.loss_bytes,
                   extra={"torch": torch.__version__, "threads": torch.get_num_threads(),
                                             "repeats": repeats, "warmup": warmup, **L.notes_extra(model), **inputs_extra(inputs)})


def with_traced_memory(measured: Profile, traced: Profile) -> Profile:
    """`traced` (every byte, FLOPs and moved bytes, children as the trace splits layers) with
    `measured`'s seconds: [Note: measured times, traced bytes]. The layers must be the same."""
    if [l.name for l in measured.layers] != [l.name for l in traced.layers]:
        raise ValueError(f"measured and traced layers differ: {[l.name for l in measured.layers]} "
                         f"vs {[l.name for l in traced.layers]}")
    layers = tuple(_timed_like(m, t) for m, t in zip(measured.layers, traced.layers))
    return dataclasses.replace(traced, layers=layers, source="measured",
                               extra={**measured.extra, "memory": "traced", "trace_device": traced.extra.get("device")})


def _timed_like(measured: LayerProfile, traced: LayerProfile) -> LayerProfile:
    """The traced layer with the measured forward and backward seconds; its recomputed ops'
    seconds are the measured forward times the trace's fraction. A child the measurement did
    not time takes the trace's seconds at the parent's measured/traced ratio."""
    kids = {k.name: k for k in measured.children}
    scale = measured.forward_seconds / traced.forward_seconds if traced.forward_seconds else 0.0
    fwd = measured.forward_seconds
    sac = traced.selective_recompute_seconds
    children = tuple(_timed_like(kids[c.name], c) if c.name in kids else _scaled(c, scale) for c in traced.children)
    return dataclasses.replace(
        traced, forward_seconds=fwd, backward_seconds=measured.backward_seconds, children=children,
        selective_recompute_seconds=None if sac is None else (
            stable(fwd * sac / traced.forward_seconds) if traced.forward_seconds else 0.0),
        selective_all=_all_scaled(traced, fwd / traced.forward_seconds if traced.forward_seconds else 0.0))


def _all_scaled(layer: LayerProfile, scale: float) -> tuple:
    """`LayerProfile.selective_all` with its recompute seconds times `scale`."""
    if not layer.selective_all:
        return ()
    *rest, rec = layer.selective_all
    return (*rest, stable(rec * scale))


def _scaled(layer: LayerProfile, scale: float) -> LayerProfile:
    """A traced layer's seconds times `scale` (its children's too)."""
    sac = layer.selective_recompute_seconds
    return dataclasses.replace(layer, forward_seconds=stable(layer.forward_seconds * scale),
                               backward_seconds=stable(layer.backward_seconds * scale),
                               selective_recompute_seconds=None if sac is None else stable(sac * scale),
                               selective_all=_all_scaled(layer, scale),
                               children=tuple(_scaled(c, scale) for c in layer.children))


def shared_rows(inputs: tuple) -> int:
    """The leading dimension every tensor input shares: the batch (tokens and targets, images
    and labels); 0 when they disagree (a graph's node features and its edge list: no batch to
    name) or no input has one. One tensor alone is taken as batched."""
    lead = {int(t.shape[0]) for t in L.tensors_in(inputs) if t.dim() >= 1}
    return lead.pop() if len(lead) == 1 else 0


def batch_and_seq(inputs: tuple) -> tuple[int, int]:
    """(batch, seq) when the inputs share a leading dimension (`shared_rows`): seq is a 2-D
    integer first input's second dimension (token ids), else 0; (1, 0) when they share none
    (what plans state then is `inputs_words`)."""
    rows = shared_rows(inputs)
    if not rows:
        return 1, 0
    first = inputs[0] if inputs else None
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        return rows, int(first.shape[1])
    return rows, 0


def inputs_words(inputs: tuple) -> str:
    """"inputs as built (2000x16 float32, 2x8000 int64)": the label of inputs with no shared
    batch dimension (a micro-batch of one graph's 2000 nodes would mislead)."""
    shapes = ", ".join("x".join(map(str, t.shape)) + f" {str(t.dtype).removeprefix('torch.')}"
                       for t in L.tensors_in(inputs))
    return f"inputs as built ({shapes})"


def inputs_extra(inputs: tuple) -> dict:
    """Profile.extra's "inputs" label where the inputs have no batch dimension, else nothing."""
    return {} if shared_rows(inputs) else {"inputs": inputs_words(inputs)}
