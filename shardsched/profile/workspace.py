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
A layer's window opens where the previous layer's backward ended (its full backward hook;
the first at backward's start), not at its own full backward pre-hook: code that runs
after it in forward outside every layer (a tied LM head and its loss, folded into its
activations by the profilers) runs just before its backward, and those transients are
its own; the lower of the two starts is its base (the previous layer's last temporaries
may still be live when its window closes). Children get their own windows, pre-hook to
hook. A layer none of whose inputs needs a gradient (the embedding) gets its backward
hook before its weight gradient exists, so its window stays open until backward ends.
Live bytes are counted as PyTorch's `torch.distributed._tools.mem_tracker.MemTracker`
does: every storage an op produces, once, released by a weakref finalizer; that works on
real and fake tensors alike.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class BackwardWorkspace(TorchDispatchMode):
    """Enter it around forward and backward; `workspace[name]` then holds each hooked
    module's backward workspace in bytes ([Note: what the backward workspace is])."""

    def __init__(self, model: nn.Module, layers: list[str], children: list[str]):
        super().__init__()
        self.live = 0
        self._seen = WeakIdKeyDictionary()
        self._open: dict[str, list[int]] = {}  # name -> [base, peak]
        self._next: list[int] | None = None  # the window the next layer's backward takes over
        self.workspace: dict[str, int] = {}
        self.handles = []
        for name in [n for n in layers if n]:
            self._attach(model.get_submodule(name), name, layer=True)
        for name in children:
            self._attach(model.get_submodule(name), name, layer=False)

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
        weakref.finalize(st, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self._track(t)
        for window in [*self._open.values(), *([self._next] if self._next else [])]:
            window[1] = max(window[1], self.live)
        return out

    def start_backward(self) -> None:
        """Call between the forward and `backward()`: the first layer's window opens."""
        self._next = [self.live, self.live]

    def _incoming(self, grads) -> int:
        """Bytes of the distinct tracked storages among `grads`."""
        sts = {id(st): st for g in grads if isinstance(g, torch.Tensor)
               for st in [g.untyped_storage()] if st in self._seen}
        return sum(self._seen[st] for st in sts.values())

    def _attach(self, module: nn.Module, name: str, *, layer: bool) -> None:
        def bwd_pre(m, grad_output):
            base = self.live - self._incoming(grad_output)
            if layer and self._next is not None:
                # The lower base of the two: the previous layer's last temporaries may
                # still have been live when its window closed.
                self._open[name], self._next = [min(base, self._next[0]), max(self.live, self._next[1])], None
            else:
                self._open[name] = [base, self.live]

        def bwd_post(m, grad_input, grad_output):
            if name in self._open and not all(g is None for g in grad_input):
                self._close(name)
                if layer:  # its peak from the next op on: what the closing layer leaves is freed first
                    base = self.live - self._incoming(grad_input)
                    self._next = [base, base]

        self.handles += [module.register_full_backward_pre_hook(bwd_pre),
                         module.register_full_backward_hook(bwd_post)]

    def _close(self, name: str) -> None:
        base, peak = self._open.pop(name)
        self.workspace[name] = max(self.workspace.get(name, 0), peak - base)

    def finish(self) -> dict[str, int]:
        """Close the windows still open (layers without input gradients); remove the hooks."""
        for name in list(self._open):
            self._close(name)
        self._next = None
        for h in self.handles:
            h.remove()
        self.handles = []
        return self.workspace


def above_model(measured: int, activation_bytes: int, grad_bytes: int) -> int:
    """`LayerProfile.workspace_bytes` from a measured backward workspace: the simulator's
    backward high-water mark is max(the layer's activations, its unsharded gradients)
    plus the workspace (`sim.memory._backward`, at the start and at the end of the
    backward), while the measured peak rises above its activations by `measured`,
    gradients included. So where the gradients outweigh the activations, the excess
    is already counted and comes off ([Note: what the backward workspace is])."""
    return max(0, measured - max(0, grad_bytes - activation_bytes))
