"""Repeated blocks traced once (`profile.trace`): a stack of identical blocks is traced with
its first three, and the statistics of the middle one stand for the rest."""
from __future__ import annotations

from collections import defaultdict

import torch.nn as nn

from shardsched.profile import layers as L
from shardsched.profile.trace_record import PRE, Stats, Tracer

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


def find_stacks(model: nn.Module, names: list[str]) -> list[tuple[str, int]]:
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


class Truncated:
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


def untraced(name: str, stacks) -> bool:
    e = _entry(name, stacks)
    return e is not None and e[2] >= 3


def traced_source(name: str, stacks) -> str | None:
    """For entries 2..n-1 after tracing: the traced entry that stands for it."""
    e = _entry(name, stacks)
    if e is None or e[2] < 2:
        return None
    prefix, n, idx, rest = e
    return f"{prefix}{2 if idx == n - 1 else 1}{rest}"


def expand(tracer: Tracer, full: list[str], kids: list[str], stacks) -> None:
    """Give every entry 2..n-1 the stats of the traced entry that stands for it."""
    st = tracer.stats
    targets = [(name, traced_source(name, stacks)) for name in [*full, *kids] if traced_source(name, stacks)]
    plain = (st.ops, st.acts, st.workspace, st.inputs, st.outside, st.outside_largest, st.calls, st.forward_peak, st.recompute_peak,
             st.forward_nosave, st.entry, st.exit, st.output, st.recall, st.bucketed, st.flight,
             st.outside_kept, st.input_saved, st.input_saved_before, st.input_saved_outside, st.input_resaved, st.input_shared,
             *(d for sc in st.sac.values() for d in (sc.saved, sc.moved, sc.forward, sc.outside, sc.input_stored)))
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
        if src in st.grad_inputs:  # `LayerProfile.input_needs_grad`
            st.grad_inputs.add(name)

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


def fold_target(key: str, ran: list[str], final) -> str | None:
    """The final layer the work of `key` goes to: itself, else the nearest final layer before
    it (or after it, before any)."""
    if key in final:
        return key
    order = [PRE, *ran]
    i = order.index(key) if key in order else 0
    found = next((o for o in reversed(order[:i]) if o in final), None) or \
        next((o for o in order[i:] if o in final), None)
    # no layer at all (every candidate called again after another ran: [Note: a repeated layer
    # between other layers]): the root is the whole model, its work the root's
    return found if found is not None else (L.ROOT if L.ROOT in final else None)


def fold(stats: Stats, ran: list[str], final: list[str]) -> None:
    """Work of keys that are not final layers (before any layer ran; layers that
    ran but own nothing) goes to the nearest final layer before them (or the first)."""
    for k in [PRE, *ran]:
        if k in final or k == L.ROOT:
            continue
        target = fold_target(k, ran, final)
        if target is None:
            continue
        for ph in ("fwd", "bwd"):
            for c, f in stats.flops[ph].pop(k, {}).items():
                stats.flops[ph][target][c] += f
            stats.moved[ph][target] += stats.moved[ph].pop(k, 0)
        stats.ops[target] += stats.ops.pop(k, 0)
        # Its module is not the target's, so checkpointing the target does not recompute it
        # (nor does selective checkpointing store its outputs).
        for sc in stats.sac.values():
            for d in (sc.saved, sc.moved, sc.flops, sc.outside, sc.input_stored):
                d.pop(k, None)
        stats.outside[target] += stats.acts.get(k, 0)
        stats.acts[target] += stats.acts.pop(k, 0)
        stats.outside.pop(k, None)
        stats.outside_kept[target] += stats.outside_kept.pop(k, 0)
        stats.input_saved.pop(k, None)  # its inputs are not the target's
        stats.input_saved_before.pop(k, None)
        stats.input_resaved.pop(k, None)
        stats.input_saved_outside.pop(k, None)
        stats.input_shared.pop(k, None)
        stats.outside_largest[target] = max(stats.outside_largest[target], stats.outside_largest.pop(k, 0),
                                            stats.largest_saved.pop(k, 0))
        stats.workspace[target] = max(stats.workspace[target], stats.workspace.pop(k, 0))
        stats.loss_window[target] = max(stats.loss_window[target], stats.loss_window.pop(k, 0))
        stats.forward_peak[target] = max(stats.forward_peak[target], stats.forward_peak.pop(k, 0))
        stats.recompute_peak[target] = max(stats.recompute_peak[target], stats.recompute_peak.pop(k, 0))
        stats.forward_nosave[target] = max(stats.forward_nosave[target], stats.forward_nosave.pop(k, 0))
        stats.exit[target] = max(stats.exit[target], stats.exit.pop(k, 0))
        stats.recall[target] = max(stats.recall[target], stats.recall.pop(k, 0))
        stats.bucketed[target] = max(stats.bucketed[target], stats.bucketed.pop(k, 0))
        for sc in stats.sac.values():
            sc.forward[target] = max(sc.forward[target], sc.forward.pop(k, 0))


