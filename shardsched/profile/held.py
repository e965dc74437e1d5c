"""Outputs the caller's code holds: which earlier layers' outputs are still alive as each layer
starts, in a forward that saves nothing (as a checkpointed layer's forward runs).

[Note: outputs the caller's code holds]
The memory model keeps a layer's output as long as something saves it: its own last op (a ReLU),
the next layer (as its input), code outside every layer (a pooling). When the layer recomputes
its own op saves nothing, yet the forward that called it may still hold the output in a local
variable: `x = dec(torch.cat([up(x), skip], 1))` holds the old `x` through `dec`'s forward, and
a U-Net written with named locals (`e1`, `e2`, `m`) holds each until it returns. Such a tensor is
live beside the later layers' forward moments, and freed as forward ends (backward never sees
it). So the trace runs the no-save forward with these hooks: as each layer starts (first call),
every earlier layer's output still alive that is not among its own inputs. `trace` then asks of
each what the plain trace counted it as: saved by its producer's own code (live beside a later
layer only when the producer recomputes: `LayerProfile.code_held`), saved by nothing before
the later layer runs (always: `LayerProfile.code_held_bytes`), or kept by some other code that
ran (counted already). An output that a layer run in between takes as its input is that
layer's to keep, and counted there, unless nothing saves it (a Linear given a transposed GRU
output saves its contiguous copy: the output itself, in the caller's local, was 4.8% under a
pointer network's verified peak under full_shard). A U-Net's selective plan ran 3.3% above its prediction,
and an auto plan over its budget, without this.

[Note: results of outside code the caller holds]
The same holds for what code outside every layer makes: a Mixer whose residual adds run in the
model's own forward (`h = h + tok(n1(h))`) holds its last sum `h` in a local through the head's
forward (the head reads `h.mean(1)`), and no op saves it: fused under full_shard it was 3.2%
under its verified peak. The plain trace records every result of outside code
(`Tracer._outside_held`, fed by the FLOP counter's dispatch), and as each layer starts (first
call) counts those still alive that nothing has saved, that are not among its inputs and that no
layer has taken as an input (that layer's to count, as above): `LayerProfile.code_held_bytes`,
beside its forward moments whatever recomputes. A result something saves later is counted
there from then on, not here.

[Note: an output only selective checkpointing saves]
A Perceiver's input projection returns `kv`, which no op saves (the attention after it, in the
model's own code, keeps copies), and its forward holds `kv` in a local through every later
layer: `code_held_bytes`, whatever recomputes. Its `+sac` policy stores the projection's matmul
output, the same storage, in the producer's kept bytes (`selective_saved_bytes`). So such an
output is held always, less when its producer recomputes selectively: its `code_held` entry is
negative there (a fused `+sac` Perceiver was 5.3% over without it).

[Note: outputs code after a later layer saves]
`s = einsum("bnd,bmd->bnm", self.q(prev), self.k(e))` holds q's output in the caller through
k's forward; the einsum, code outside every layer after k, saves it first, so the trace counts
it in k's activations (`outside_bytes`), live from k's compute moment on. Before that (k's
copy-out, or in a fused unit the moment k's module gathers again) nothing counted it: a pointer
network was 3.0% under its verified peak under full_shard. So as a layer starts, an output the
code after a later layer saves is held whatever recomputes (`code_held_bytes`), and one the
code after this very layer saves is held until its compute (`LayerProfile.held_to_save_bytes`,
at its copy-out and its lead moment only).
"""
from __future__ import annotations

import weakref

import torch.nn as nn

from shardsched.profile import layers as L

Tag = tuple[str, int]  # (producing layer, index among its outputs)


class HeldOutputs:
    """Hook `layers` (forward, first call each): `held[k]` lists (tag, bytes) of the earlier
    layers' outputs alive as layer k starts, not among its inputs; `inputs[k]` the tags among
    its inputs; `order` the layers in the order they ran."""

    def __init__(self, model: nn.Module, layers: list[str]):
        self._outputs: dict[Tag, tuple[weakref.ref, int]] = {}
        self.held: dict[str, list[tuple[Tag, int]]] = {}
        self.inputs: dict[str, set[Tag]] = {}
        self.order: list[str] = []
        self.handles = []
        for name in layers:
            module = model.get_submodule(name)
            self.handles += [module.register_forward_pre_hook(L.in_forward(self._pre(name)), with_kwargs=True),
                             module.register_forward_hook(L.in_forward(self._post(name)), with_kwargs=True)]

    def _live(self) -> dict[int, tuple[Tag, int]]:
        """Storage key -> (tag, bytes) of the tagged outputs still alive."""
        out = {}
        for tag, (ref, nbytes) in self._outputs.items():
            st = ref()
            if st is not None:
                out[st._cdata] = (tag, nbytes)
        return out

    def _pre(self, name: str):
        def hook(m, args, kwargs):
            if name in self.inputs:  # a later call of a repeated module
                return
            live = self._live()
            ins = {t.untyped_storage()._cdata for t in L.tensors_in((args, kwargs))}
            self.inputs[name] = {live[k][0] for k in ins if k in live}
            self.held[name] = [(tag, b) for k, (tag, b) in live.items() if k not in ins and tag[0] != name]
            self.order.append(name)
        return hook

    def _post(self, name: str):
        def hook(m, args, kwargs, out):
            if any(tag[0] == name for tag in self._outputs):
                return
            for idx, t in enumerate(L.tensors_in(out)):
                st = t.untyped_storage()
                self._outputs[(name, idx)] = (weakref.ref(st), st.nbytes())
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class OutputStatus:
    """What the plain trace counted each layer's output as (`Tag` -> status): "own" (its
    producer's code saved it first), "own-sac" (and selective checkpointing keeps it under
    both policies), "own-sac-all" (under `+sac-all` only),
    "outside" (code outside every layer saved it, or saved it again: counted whatever the
    producer does), a layer's name (that layer's code saved it first), "none", or "none-sac"
    / "none-sac-all" (nothing saved it, but selective checkpointing of its producer keeps it)."""

    def __init__(self):
        self.status: dict[Tag, str] = {}
        self._pending: dict[int, Tag] = {}  # storage key -> tag, outputs not saved yet
        self._own: dict[int, Tag] = {}  # storage key -> tag, outputs their producer saved
        self.saved_after: dict[Tag, str] = {}  # "outside": the layer whose outside code saved it first

    def produced(self, tag: Tag, key: int, storage, *, saved_by: str | None, sac: tuple[bool, ...]) -> None:
        """Layer `tag[0]` returned this storage (first call); `saved_by`: the layer whose own
        code saved it first, if any did; `sac`: whether `+sac` and `+sac-all` keep it."""
        if tag in self.status:
            return
        if saved_by == tag[0]:
            self.status[tag] = "own-sac" if all(sac) else "own-sac-all" if any(sac) else "own"
            self._own[key] = tag
        elif saved_by is not None:
            self.status[tag] = saved_by
        else:  # [Note: an output only selective checkpointing saves]
            self.status[tag] = "none-sac" if all(sac) else "none-sac-all" if any(sac) else "none"
            self._pending[key] = tag
            weakref.finalize(storage, self._pending.pop, key, None)  # its key may be reused

    def saved(self, key: int, *, first: bool, outside: bool, layer: str) -> None:
        """A storage saved for backward (`first`: its first save) by code outside every layer
        or by `layer`'s."""
        tag = self._pending.pop(key, None) if first else None
        if tag is not None:
            self.status[tag] = "outside" if outside else layer
            if outside:
                self.saved_after[tag] = layer
        if outside and key in self._own:  # kept by that code when its producer recomputes
            self.status[self._own.pop(key)] = "outside"


def code_held(held: HeldOutputs, out: OutputStatus, layer: str, final: set[str]) -> tuple[dict, int, int]:
    """(`LayerProfile.code_held`, `LayerProfile.code_held_bytes`, `LayerProfile.held_to_save_bytes`)
    of `layer` ([Note: outputs the caller's code holds], [Note: outputs code after a later layer
    saves])."""
    order, status = {name: i for i, name in enumerate(held.order)}, out.status
    if layer not in held.held or layer not in final:
        return {}, 0, 0
    per, always, pending = {}, 0, 0
    for (producer, idx), nbytes in held.held[layer]:
        between = held.order[order[producer] + 1:order[layer]]
        s = status.get((producer, idx), "none")
        if producer not in final or any((producer, idx) in held.inputs.get(n, ()) for n in between) \
                and s not in ("none", "none-sac", "none-sac-all"):  # that layer's, if anything saved it
            continue
        if s in ("own", "own-sac", "own-sac-all"):
            full, sel, sel_all = per.get(producer, (0, 0, 0))
            per[producer] = (full + nbytes, sel + (0 if s == "own-sac" else nbytes),
                             sel_all + (0 if s != "own" else nbytes))
        elif s == "none" or (s in order and order[s] >= order[layer]):
            always += nbytes
        elif s == "outside" and (after := out.saved_after.get((producer, idx))) in order and after in final:
            # [Note: outputs code after a later layer saves]
            if order[after] > order[layer]:
                always += nbytes
            elif after == layer:
                pending += nbytes
        elif s in ("none-sac", "none-sac-all"):  # [Note: an output only selective checkpointing saves]
            always += nbytes
            full, sel, sel_all = per.get(producer, (0, 0, 0))
            per[producer] = (full, sel - (nbytes if s == "none-sac" else 0), sel_all - nbytes)
    return per, always, pending
