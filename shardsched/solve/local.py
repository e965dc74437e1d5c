"""Deterministic local search: polish one grouping's best schedule, move by move.

Where the MILP stops at its node limit (or is not run: groupings above `Effort.milp_units`)
the schedule it returns is often a few percent from what a longer search finds, and the
distance is made of many small, independent choices: one unit's strategy (full_shard_node
instead of hybrid_shard), one unit's checkpointing, one AllGather launched a step earlier.
Each such choice is a move here, re-scored exactly by greedy's `Evaluator` (the fast peak,
then the replay), so nothing is approximated:
  1. single moves, first improvement, scanning units in order: a unit's strategy (its backward
     AllGather kept where it was, or at its use), its checkpointing (none, full, and selective
     where the Problem offers it: `Problem.checkpoint_modes`), its forward or backward
     AllGather one step earlier or later (within `milp.windows`, the declared space);
  2. when no single move improves: exchanges. A faster move that does not fit is paired with a
     move that frees memory at the least cost (at the budget, speed in one unit is bought with
     memory from another: the 24-layer GPT on 512 A100s at 8 GiB needed such pairs).
  3. when neither does: kicks ([Note: kicks]).
Work is counted in evaluations (`Effort.local_evals`), never in seconds ([Note: determinism]
in `solve.search`); the result is never slower than the start and always fits the budget.

[Note: kicks] The starts hoist every AllGather as far ahead as fits (`greedy.hoist_uniform`),
and single moves cannot leave that shape: one AllGather launched later changes little while
the others still queue ahead of it on the FIFO channel. A kick caps every launch at d steps
ahead of its use at once (d = 1, 2, 4, ...: the schedule then holds less memory, so it fits)
and descends from there; the first kick that ends faster than the local optimum is taken and
the kicks start again from it (iterated local search, Lourenco, Martin and Stuetzle 2003). On
an 81-layer GPT over 1024 A100s at 61.5 GiB (`bench/bench_plan_speed.py --random 8 --seed 0`,
83 units, no MILP) the descent stops at 2.1425 s, the kicks reach 2.1357 s (10x search: 2.1352).
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

from shardsched.core.types import Checkpoint
from shardsched.solve.candidates import Choice, Problem
from shardsched.solve.greedy import Evaluator, _hoisted, _with

PAIR_TRIES = 8
"""Exchanges tried per round: the best PAIR_TRIES faster moves x the PAIR_TRIES cheapest freeing ones."""


class Move(NamedTuple):
    """One candidate schedule, with what it costs: seconds and peak relative to the current one."""

    choice: Choice
    dt: float
    dpeak: int


class Local:
    """The search state: the current schedule, its seconds and peak, and the evaluations left.

    [Note: evaluations remembered] A pass of single moves that takes none replays every
    neighbour for its seconds, and the exchanges' survey then scores the same neighbours again
    (and kicks revisit schedules): 41% of the replays and 11% of the peaks of a polish were
    repeats (`bench_plan_speed.py --random 8 --seed 0`, r2). Each Choice's seconds and peak are
    kept for the polish; a remembered one still counts as an evaluation against `left`, so the
    work limit, and so every answer, is what it was without the memory."""

    def __init__(self, p: Problem, ch: Choice, *, budget: int, ahead: int, evals: int):
        self.ev, self.p, self.budget, self.ahead, self.left = Evaluator(p), p, budget, ahead, evals
        self.known: dict[Choice, list] = {}
        """Choice -> [seconds, peak or None]: [Note: evaluations remembered]."""
        self.ch, self.t, self.peak = ch, self._seconds(ch), self._peak(ch)

    def _entry(self, ch: Choice) -> list:
        e = self.known.get(ch)
        if e is None:
            e = self.known[ch] = [self.ev.seconds(ch), None]
        return e

    def _seconds(self, ch: Choice) -> float:
        return self._entry(ch)[0]

    def _peak(self, ch: Choice) -> int:
        e = self._entry(ch)
        if e[1] is None:
            e[1] = self.ev.peak(ch)
        return e[1]

    def _score(self, ch: Choice, *, need_fit: bool, faster: bool = False) -> tuple[float, int] | None:
        """(seconds, peak) of `ch`; None when out of work, when it must fit and does not, or
        when it must be faster than the current schedule and is not. The seconds first when
        it must be faster: most moves are not, and the replay costs about a quarter of the peak."""
        if self.left <= 0:
            return None
        self.left -= 1  # remembered or not ([Note: evaluations remembered])
        t = self._seconds(ch)
        if faster and not t < self.t * (1 - 1e-12):
            return None
        peak = self._peak(ch)
        if need_fit and peak > self.budget:
            return None
        return t, peak

    def _take(self, ch: Choice, t: float, peak: int) -> bool:
        if peak <= self.budget and t < self.t * (1 - 1e-12):
            self.ch, self.t, self.peak = ch, t, peak
            return True
        return False


def neighbours(p: Problem, ch: Choice, i: int, *, ahead: int) -> Iterator[Choice]:
    """Every single move at unit i, in a fixed order."""
    n = p.n
    for k in p.allowed[i]:
        if k is ch.strategies[i]:
            continue
        moved = _with(ch, i, k)
        if k.gathers_for_backward and ch.bwd[i] is not None:
            moved = _hoisted(moved, bwd={i: ch.bwd[i]})
        yield moved
    ck = ch.ckpt or (False,) * n
    for mode in p.checkpoint_modes(i):
        if Checkpoint(mode) is not Checkpoint(ck[i]):
            moved = ck[:i] + (mode,) + ck[i + 1:]
            yield ch._replace(ckpt=moved if any(moved) else ())
    lo, hi = max(0, i - ahead), i
    for f in _steps(ch.fwd[i], lo, hi):
        yield _hoisted(ch, fwd={i: f})
    if ch.bwd[i] is not None:
        for b in _steps(ch.bwd[i], max(n, 2 * n - 1 - i - ahead), 2 * n - 1 - i):
            yield _hoisted(ch, bwd={i: b})


def _steps(at: int, lo: int, hi: int) -> list[int]:
    """Launch points 1, 2, 4, 8, ... steps earlier or later than `at`, within [lo, hi]: a
    deeper prefetch pays only once it clears the channel's queue, which one step may not."""
    out, d = [], 1
    while at - d >= lo or at + d <= hi:
        out += [x for x in (at - d, at + d) if lo <= x <= hi]
        d *= 2
    return out


def _singles(s: Local) -> bool:
    """One pass of first-improvement single moves; whether any was taken."""
    took = False
    for i in range(s.p.n):
        for cand in neighbours(s.p, s.ch, i, ahead=s.ahead):
            r = s._score(cand, need_fit=True, faster=True)
            if r is not None and s._take(cand, *r):
                took = True
                break  # unit i changed: its other moves are relative to the old schedule
    return took


def _survey(s: Local) -> list[Move]:
    """Every single move, fitting or not, with its cost (for the exchanges)."""
    out = []
    for i in range(s.p.n):
        for cand in neighbours(s.p, s.ch, i, ahead=s.ahead):
            r = s._score(cand, need_fit=False)
            if r is None:
                return out
            out.append(Move(cand, r[0] - s.t, r[1] - s.peak))
    return out


def _merge(p: Problem, a: Choice, b: Choice, base: Choice) -> Choice:
    """`a`'s changes and `b`'s changes (relative to `base`) together."""
    def full(ch: Choice) -> Choice:
        return ch._replace(ckpt=ch.ckpt or (False,) * p.n)

    a, b, base = full(a), full(b), full(base)
    fields = [tuple(vb[i] if va[i] == v0[i] else va[i] for i in range(p.n))
              for va, vb, v0 in zip(a, b, base)]
    return Choice(*fields[:3], fields[3] if any(fields[3]) else ())


def _exchange(s: Local) -> bool:
    """The best fitting pair of a faster move that does not fit and a move that frees memory."""
    moves = _survey(s)
    faster = sorted((m for m in moves if m.dt < 0 and s.peak + m.dpeak > s.budget), key=lambda m: m.dt)
    freeing = sorted((m for m in moves if m.dpeak < 0), key=lambda m: (m.dt / -m.dpeak, m.dt))
    for up in faster[:PAIR_TRIES]:
        over = s.peak + up.dpeak - s.budget
        for down in [m for m in freeing if -m.dpeak >= over and m.dt + up.dt < 0][:PAIR_TRIES]:
            cand = _merge(s.p, up.choice, down.choice, s.ch)
            r = s._score(cand, need_fit=True, faster=True)
            if r is not None and s._take(cand, *r):
                return True
    return False


def within(p: Problem, ch: Choice, ahead: int) -> Choice:
    """`ch` with every AllGather launched at most `ahead` steps before its use (`milp.windows`)."""
    n = p.n
    return ch._replace(fwd=tuple(max(f, i - ahead) for i, f in enumerate(ch.fwd)),
                       bwd=tuple(None if b is None else max(b, 2 * n - 1 - i - ahead) for i, b in enumerate(ch.bwd)))


def _descend(s: Local) -> None:
    """Single moves, then exchanges, until neither improves or the work is spent."""
    while s.left > 0:
        if _singles(s):
            continue
        if not _exchange(s):
            return


def _kick(s: Local) -> bool:
    """From a local optimum: every AllGather capped at d steps ahead (d = 1, 2, 4, ...), then
    a descent from there; the first that ends faster is taken. [Note: kicks]"""
    base, t, peak = s.ch, s.t, s.peak
    d = 1
    while d < s.ahead and s.left > 0:
        cand = within(s.p, base, d)
        d *= 2
        r = s._score(cand, need_fit=True) if cand != base else None
        if r is None:
            continue
        s.ch, s.t, s.peak = cand, *r
        _descend(s)
        if s.t < t * (1 - 1e-12):
            return True
        s.ch, s.t, s.peak = base, t, peak
    return False


def polish(p: Problem, ch: Choice, *, budget: int, ahead: int, evals: int) -> Choice:
    """The best schedule the moves and kicks reach from `ch` within `evals` evaluations
    (`ch` itself when none is faster). `ch` must fit."""
    s = Local(p, ch, budget=budget, ahead=ahead, evals=evals)
    _descend(s)
    while s.left > 0 and _kick(s):
        pass
    return s.ch
