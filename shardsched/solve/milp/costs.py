"""The MILP's constants: per-unit seconds and bytes of one Problem (`costs_of`), read once
from the simulator's own formulas so every row prices what the simulator prices."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from shardsched.cost.strategy import all_reduces, gather_seconds, held_after_forward, reduce_seconds, shard_count
from shardsched.sim.memory import (forward_gathers, holds_root_grad, in_place_held, in_place_reduce_bytes,
                                    own_grad_bytes, reduce_moment_bytes, root_grad_bytes)
from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.milp.model import REP
from shardsched.plan.schedule import optimizer_seconds_per_param
from shardsched.core.types import Checkpoint, Strategy


class Costs(NamedTuple):
    """Per-unit constants of one Problem (seconds and bytes); dicts are by strategy."""

    agf: list[dict]
    """Forward AllGather seconds."""
    agb: list[dict]
    """Backward AllGather seconds (0 for strategies that keep their parameters)."""
    red: list[dict]
    fwd: list[float]
    bwd: list[float]
    """Backward seconds without recomputation (a checkpointed unit adds `rec`)."""
    rec: list[float]
    """Seconds a checkpointed unit recomputes in its backward (`UnitCost.recompute`: its
    forward, or a selective unit's recomputed ops)."""
    shard: list[dict]
    held: list[dict]
    """Bytes held from the end of forward to the backward copy-out (`cost.strategy`)."""
    unsharded: list[int]
    """AllGather output bytes padded over the world (pending prefetches: an upper bound for
    every strategy, linear in the launch variables)."""
    ugrad: list[int]
    rsbuf: list[int]
    unsh_by: list[dict]
    """Unsharded parameter bytes per strategy (dim 0 padded to its shard count)."""
    rs_by: list[dict]
    """Bytes of the largest module's reduce beside the gradients, per strategy (`sim.memory.reduce_moment_bytes`)."""
    root_grad: int
    """Unsharded gradients of the root unit, live through backward (`sim.memory.root_grad_bytes`)."""
    act: list[int]
    inp: list[int]
    """Activations a checkpointed unit retains (its layers' inputs)."""
    ws: list[int]
    ck_start: list[int]
    """A checkpointed unit's own bytes as its backward starts (`Scenario.backward_start`)."""
    fwd_own: list[tuple[int, int]]
    """A unit's own bytes at the peak of its forward, plain and checkpointed (`Scenario.forward_bytes`)."""
    bwd_own: list[int]
    """A unit's own bytes as its backward starts, not checkpointed (`UnitCost.backward_peak`)."""
    last_end: list
    """A fused unit: its own bytes at the end of its last layer's backward, plain and
    checkpointed (`UnitCost.last_end`); None for a unit of one module."""
    inner: list
    """A fused unit: the moments after its last layer's end (`UnitCost.inner_moments`), each
    (plain bytes or None, checkpointed bytes or None, bytes per strategy: the ReduceScatter
    input, the sharded gradients and the AllGather output it holds); None otherwise."""
    inner_most: list
    """Per fused unit and strategy: (plain, checkpointed) the most of `inner` (greedy's)."""

    # [Note: inner moments as rows]
    # Inside a fused unit's backward, moment k holds bytes that depend on checkpointing (the
    # activations before layer k) and on the strategy (layer k+1's ReduceScatter input padded
    # to the shard count, the sharded gradients of the layers done), so the most over k is
    # not linear in the unit's binaries. Each moment alone is (a constant, a term on the
    # checkpointing binary, one on the strategy's); a row for every moment that is the
    # largest for some (strategy, checkpointing) makes the rows' maximum exact at every choice.

    rs_kept_by: list[dict]
    """Reduction input retained after its backward, per strategy (`UnitCost.module_reduce_numel`)."""
    lead: list[int]
    cklead: list[int]
    """Activations live when a unit's last module starts, plain and checkpointed."""
    state: object
    input_bytes: int
    opt_factor: float
    opt_per_param: float
    """Optimizer seconds per persistent (sharded) parameter (`plan.schedule.make_scenario`)."""
    sac: list
    """Per unit, its selective form's numbers (`Selective`), or None where the Problem offers
    no selective checkpointing ([Note: three checkpointing modes in the MILP])."""
    recall: list[tuple]
    """Per unit, its own bytes in the backward of a repeated layer's earlier call, as it is
    gathered again and as it computes, each (plain, checkpointed) (`UnitCost.recall_bytes`;
    0: no layer repeats)."""
    tied_unit: int
    """The unit from whose backward on the root's tied gradient exists (`Scenario.tied_unit`;
    `holds_root_grad`). In it, where a layer before its last makes it (`UnitCost.tied_late`),
    the moments before hold none: `bwd_own`, `ck_start`, `last_end`, `grad_in`, `inner` and
    their selective forms are net of `root_grad` there, which the rows add to every moment
    ([Note: where the root's tied gradient appears] in profile/trace.py)."""
    grad_in: list[int]
    """`UnitCost.grad_in_bytes` per unit (net as above): its backward copy-out's gradient."""


class Selective(NamedTuple):
    """A unit's selective form (`Problem.selective`), read as checkpointed: the checkpointed
    counterparts of `Costs`' per-unit fields ([Note: selective checkpointing as kept bytes])."""

    inp: int
    start: int
    fwd_own: int
    lead: int
    last_end: int | None
    loss: int
    """The outside code's forward transient after it (`UnitCost.after_forward`)."""
    inner: list | None
    """Own bytes of each of `Costs.inner`'s rows (same keys), None where it has no such moment."""
    rec: float
    recall: tuple[int, int] = (0, 0)
    """`UnitCost.recall_bytes` of its selective form: gathered, computing."""


# [Note: three checkpointing modes in the MILP]
# Per unit, checkpointing is none, full or selective: two binaries ck[i] (full) and sc[i]
# (selective), ck + sc <= 1. A selective unit's every moment is its checkpointed moment with
# its selective cost (plan/units.py), so each term that was `ck * (checkpointed - plain)` is
# now `ck * (full - plain) + sc * (selective - plain)`: still linear, and exact at each of the
# three choices. The inner moments of a fused unit stay one row each where they bind for some
# (strategy, mode).


def costs_of(p: Problem) -> Costs:
    cl = p.cluster
    sc = p.scenario(Choice(tuple(REP for _ in p.allowed), tuple(range(p.n)), (None,) * p.n))
    sb = sc.state
    ks = tuple(Strategy)
    # FSDP2 pads dim 0 to the strategy's shard count (`UnitCost.padded_numel`,
    # `cost.strategy.shard_count`): every size that depends on the strategy is per strategy.
    unsh_by = [{k: c.padded_numel(shard_count(k, cl)) * sb.unsharded_param for k in ks} for c in p.costs]
    # The reduction moves the whole unit (time); its largest buffer is one module's (memory).
    msg_by = [{k: c.padded_numel(shard_count(k, cl)) * sb.reduce for k in ks} for c in p.costs]
    ugrad = [own_grad_bytes(c, sc) for c in sc.units]
    rs_by = [{k: reduce_moment_bytes(c, shard_count(k, cl), reduce=sb.reduce, grad=sb.unsharded_grad, own_grad=g)
              for k in ks} for c, g in zip(p.costs, ugrad)]
    rs_kept_by = [{k: c.module_reduce_numel(shard_count(k, cl), last=True) * sb.reduce for k in ks} for c in p.costs]
    root, tied = root_grad_bytes(sc), sc.tied_unit
    untied = [root if c.tied_late and holds_root_grad(i, tied) else 0 for i, c in enumerate(sc.units)]
    inner = [_inner(c, sb, cl, unsh_by[i], sc.accumulates_in_place, sc.accumulates_sharded, root=untied[i])
             if len(c.layers) > 1 and c.layer_bytes else None
             for i, c in enumerate(p.costs)]
    plain, ckpt = sc, dataclasses.replace(sc, checkpoint=(True,) * sc.n)  # for `Scenario.forward_bytes`
    sac = _selective(p, sb, cl, inner, untied) if p.selective else [None] * p.n
    return Costs(agf=[{k: gather_seconds(k, b[k], cl, backward=False) for k in ks} for b in unsh_by],
                 agb=[{k: gather_seconds(k, b[k], cl, backward=True) if k.gathers_for_backward else 0.0 for k in ks}
                      for b in unsh_by],
                 red=[{k: reduce_seconds(k, r[k], cl) for k in ks} for r in msg_by],
                 # from the scenario: it adds the device's per-unit host overhead
                 fwd=[c.forward_seconds for c in sc.units], bwd=[c.backward_seconds for c in sc.units],
                 rec=[c.recompute() for c in sc.units],
                 shard=[{k: c.shard_numel(shard_count(k, cl)) for k in ks} for c in p.costs],
                 held=[{k: held_after_forward(k, b[k], cl) for k in ks} for b in unsh_by],
                 unsharded=[c.padded_numel(cl.world) * sb.unsharded_param for c in p.costs],
                 ugrad=ugrad,
                 rsbuf=[c.padded_numel(cl.world) * sb.reduce for c in p.costs],
                 unsh_by=unsh_by, rs_by=rs_by, root_grad=root_grad_bytes(sc),
                 act=[c.activation_bytes for c in p.costs], inp=[c.input_bytes for c in p.costs],
                 ws=[c.workspace_bytes for c in p.costs],
                 ck_start=[ckpt.backward_start(i) - untied[i] for i in range(sc.n)],
                 fwd_own=[(plain.forward_bytes(i), ckpt.forward_bytes(i)) for i in range(sc.n)],
                 bwd_own=[c.backward_peak() - d for c, d in zip(p.costs, untied)], rs_kept_by=rs_kept_by,
                 recall=[tuple(tuple(c.recall_bytes(sb.unsharded_grad, checkpointed=ck, gathered=gt)
                                     for ck in (False, True)) for gt in (True, False)) for c in p.costs],
                 last_end=[tuple(c.last_end(sb.unsharded_grad, checkpointed=ck, in_place=sc.accumulates_in_place)
                                 - untied[i] for ck in (False, True))
                           if plain.fused(i) else None for i, c in enumerate(p.costs)],
                 inner=inner, inner_most=[_inner_most(rows, s.inner if s else None) for rows, s in zip(inner, sac)],
                 lead=[c.lead_activation_bytes for c in p.costs], cklead=[c.checkpointed_lead_bytes for c in p.costs],
                 # every moment holds these: the inputs, the buffers, the loss, Adam's step scalars
                 input_bytes=sc.input_bytes + sc.buffer_bytes + sc.loss_bytes + sc.optimizer_scalar_bytes,
                 state=sb, opt_factor=sc.optimizer_workspace_factor,
                 opt_per_param=optimizer_seconds_per_param(sb, cl), sac=sac, tied_unit=tied,
                 grad_in=[c.grad_in_bytes() - d for c, d in zip(p.costs, untied)])


def _selective(p: Problem, sb, cl, inner: list, untied: list[int]) -> list:
    """`Costs.sac`: the selective forms of the units, read as checkpointed."""
    sc = p.scenario(Choice(tuple(REP for _ in p.allowed), tuple(range(p.n)), (None,) * p.n,
                           (Checkpoint.SELECTIVE,) * p.n))
    out = []
    for i, c in enumerate(sc.units):
        if not p.can_select(i):
            out.append(None)
            continue
        fused = inner[i] is not None
        moments = c.inner_moments(sb.unsharded_grad, checkpointed=True, in_place=sc.accumulates_in_place) if fused else {}
        keys = sorted(set(p.costs[i].inner_moments(sb.unsharded_grad, checkpointed=False)) | set(moments)) \
            if fused else []
        out.append(Selective(inp=c.input_bytes, start=sc.backward_start(i) - untied[i], fwd_own=sc.forward_bytes(i),
                             lead=c.checkpointed_lead_bytes,
                             last_end=c.last_end(sb.unsharded_grad, checkpointed=True, in_place=sc.accumulates_in_place)
                             - untied[i] if sc.fused(i) else None,
                             loss=c.after_forward(),
                             inner=[moments[k].beside_root(untied[i]) if k in moments else None for k in keys]
                             if fused else None,
                             rec=c.recompute(), recall=tuple(c.recall_bytes(sb.unsharded_grad, checkpointed=True, gathered=gt)
                                                                for gt in (True, False))))
    return out


def _inner(c, sb, cl, unsh: dict, in_place: bool = False, sharded: bool = False, root: int = 0) -> list[tuple]:
    """`Costs.inner` of one fused unit: its moments plain and checkpointed, paired by key,
    with what each holds per strategy, less the unit's unsharded parameters where FSDP2 has
    resharded it (`Inner.resharded`; `sim.memory._Live.inner`; `in_place`:
    `Scenario.accumulates_in_place`, what `sim.memory.in_place_reduce_bytes` holds instead;
    `sharded`: `Scenario.accumulates_sharded`, the layers reduced so far hold nothing more)."""
    ks = tuple(Strategy)
    rs = {k: c.layer_reduce_bytes(shard_count(k, cl), sb.reduce) for k in ks}
    extra = {k: c.reduce_extra_bytes(shard_count(k, cl), sb.reduce, sb.unsharded_grad) for k in ks}
    done = {k: [0] * len(c.layer_bytes) if sharded and not all_reduces(k) else c.done_grad_bytes(shard_count(k, cl), sb.grad)
            for k in ks}
    held = {k: in_place_reduce_bytes(c, rs[k], c.shard_numel(shard_count(k, cl)) * sb.grad, sb.reduce)
            for k in ks} if in_place else None
    plain, ck = (c.inner_moments(sb.unsharded_grad, checkpointed=x, in_place=in_place) for x in (False, True))
    out = []
    for key in sorted(set(plain) | set(ck)):
        m = plain.get(key) or ck[key]
        per = {k: (in_place_held(*held[k], m, c.first_reduce(), rs[k]) if held
                  else rs[k][m.reducing] + (extra[k][m.reducing] if m.output else 0) + done[k][m.done])
               + (forward_gathers(c, k) * unsh[k] if m.gathered else 0) - (unsh[k] if m.resharded else 0) for k in ks}
        out.append((plain[key].beside_root(root) if key in plain else None,
                    ck[key].beside_root(root) if key in ck else None, per))
    return out


def _inner_most(rows, sac: list | None = None) -> dict | None:
    """Per strategy, (plain, checkpointed, selective) the most of a fused unit's inner moments
    (selective: the checkpointed one where the unit has no selective form)."""
    if rows is None:
        return None
    owns = [(r[0], r[1], sac[j] if sac is not None else r[1]) for j, r in enumerate(rows)]
    return {k: tuple(max((o[x] + r[2][k] for o, r in zip(owns, rows) if o[x] is not None), default=0)
                     for x in (0, 1, 2)) for k in Strategy}



def _sac(c: Costs, i: int, field: str, plain: float) -> float:
    """Unit i's selective `field` (`Selective`), or `plain` where it has no selective form (no term)."""
    return getattr(c.sac[i], field) if c.sac[i] is not None else plain

