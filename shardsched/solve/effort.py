"""The search's deterministic work limit (`Effort`): which groupings get a MILP, how many nodes,
how much local search, and the launch windows (`ahead_for`). The notes its docstrings name
([Note: bounds last], [Note: contenders for the lead], [Note: no restart]) are in `solve.search`."""
from __future__ import annotations

from typing import NamedTuple

from shardsched.solve.candidates import Problem

FULL_WINDOW_UNITS = 40
"""Up to this many units every launch point is allowed (exact); above, the
window is capped so the MILP keeps ~2,000 launch binaries (`milp.windows`)."""
CONTEND_UNITS = 2 * FULL_WINDOW_UNITS
"""No contenders for the lead when one of them has more units ([Note: contenders for the lead]):
GPT-3's 97-unit groupings have their 10 s in starts and polishes already."""


class Effort(NamedTuple):
    """The deterministic work limit. 10x effort = 10x the nodes and MILPs on groupings
    of up to 10x the units (the "10x longer search" of bench/bench_plan_speed.py)."""

    scale: float = 1.0
    nodes: int = 100
    """Branch-and-bound nodes per grouping at scale 1."""
    milp_units: int = 16
    """Groupings other than the lead of more units get no MILP (their bound: the LP relaxation,
    [Note: bounds last]); above `light_units` theirs is light. It was 20 with HiGHS's defaults: a
    full-window MILP of 18-20 units took 5-8 CPU s whatever its node limit (HiGHS's root: cut
    rounds and sub-MIPs), and two or three such groupings took 11-22 CPU s of one plan
    (`bench_plan_speed.py --random 8`, seeds 7 and 8, r0). Light, up to 16 units, they cost a few
    CPU s where they run (seed 10's r0: two 15-unit groupings, 2.2 -> 5.6 CPU s, and a plan of
    0.5194 s against 0.5248 without them and 0.5207 for its 10x search); at 20, seeds 7's and 8's
    r0 reach their 10x plans but one takes 10.4 CPU s. Seeds 0-9's 80 plans are the same at 8 and
    16. Small groupings' MILPs also prove small instances optimal (tests/solve/test_search_vs_brute)."""

    def node_limit(self) -> int:
        return max(1, round(self.nodes * self.scale))

    lead_units: int = 20
    """The grouping with the best start (visited first) gets its MILP over every launch point
    up to this size, and over narrowed launch windows above it (`narrow`). It was 40: the
    full-window root node of 23-34 units took 7-15 CPU s of the 10 s target, and at 100 nodes
    its answer came from the root's heuristics, near the start; narrowed, the same leads take
    0.4-4 s and their polished answers were as fast or faster (s7: 25 units on 1024 H100s,
    2.6202 -> 2.5920 s, the 10x search's)."""

    def runs_milp(self, p: Problem, *, lead: bool = False) -> bool:
        return p.n <= (self.lead_units if lead else self.milp_units) * self.scale or (lead and self.narrow(p) > 0)

    lead_launches: int = 256
    """Above `lead_units`, the lead grouping's MILP keeps every strategy and checkpointing
    choice but only launch points within about lead_launches / (2n) steps of their use: HiGHS's
    root node is what costs, and it grows with the binaries (a 40-layer GPT's 42 units on 1024
    H100s at 7.4 GiB: 28 s at 23 steps, 7.5 s at 3). That MILP's answer is then polished over the
    whole window; its dual bound covers only the narrowed space, so it bounds nothing. It
    works as a large move of the local search: strategies of many units change at once."""

    narrow_units: int = 80
    """Lead groupings of up to this many units (at scale 1) get the narrowed MILP, over windows
    of at least 2 steps (it was the 64 units at which `lead_launches // (2n)` is still 2). On
    65-80 units its root takes 2-5 CPU s, and it is the only large move there: the polish of
    `bench_plan_speed.py --random 8 --seed 3`'s r0 (74 units) stops at 1.3647 s with 1x-10x its
    local work; the 2-step MILP reaches 1.3477 s and the polish after it 1.3190, the 10x search's
    (r1, 74 units: 12.2868 -> 12.2782, the 10x's)."""

    def narrow(self, p: Problem) -> int:
        """The narrowed launch window of the lead grouping's MILP (0: full window, or none)."""
        steps = max(2, self.lead_launches // (2 * p.n))
        return steps if self.lead_units * self.scale < p.n <= self.narrow_units * self.scale else 0

    light_units: int = 8
    """Groupings of more units (at scale 1) get a light MILP: no strong branching (HiGHS's
    `mip_pscost_minreliable` = 0), no restart and no presolve ([Note: no restart]). There only the
    lead grouping gets a MILP, and its 100 nodes end at the root's heuristics (RINS, RENS) around
    the polished start. It was 20 units, for strong branching only (half the root's time at
    25-29 units, the same schedules and bounds); the full-window leads of 18-20 units then took
    4.8-8.1 CPU s with HiGHS's defaults, 2.1-3.8 s light, ending at the same schedule on two of four
    (`bench_plan_speed.py --random 8`, seeds 6-9, r0), a faster one on one (0.5448 -> 0.5403 s) and
    0.3% slower on one (0.8856 -> 0.8882 s, before the polish after it)."""

    def light(self, p: Problem) -> bool:
        return p.n > self.light_units * self.scale

    def reliable(self, p: Problem) -> int:
        return 0 if self.light(p) else 8

    local_work: int = 400_000
    """Unit-evaluations of the local search (`solve.local`) per polish at scale 1: a polish of
    a grouping of n units may replay up to local_work / n schedules (each replay is O(n)),
    up to about 2 s on the 2-core machine whatever n. It was 60,000 before evaluations got
    ~8x cheaper (`solve.replay`; the peak only for moves that are faster): the 24-layer GPT of
    bench/bench_plan_speed.py reaches the 10x search's 0.2013 s at 400,000, 0.2050 s at 240,000."""

    def local_evals(self, p: Problem) -> int:
        return int(self.local_work * self.scale) // max(1, p.n)

    bound_units: int = 40
    """Groupings of up to this many units (at scale 1) that got no full-window MILP (the other
    groupings, a narrowed lead) are bounded by the LP relaxation over the whole window, last and
    only while it can raise the plan's bound ([Note: bounds last]; `milp.relaxation_bound`,
    0.05-0.4 CPU s). It was a root-only MILP for the narrowed lead (1-4 CPU s): its bound was the
    relaxation's (the 24-layer GPT: gap 0.02% instead of 19% from `milp.lower_bound`)."""

    halve_units: int = 40
    """A lead grouping of more units that gets a narrowed MILP gets half the local work per
    polish: that MILP's root takes 4-6 CPU s (41-64 units) and the 10 s target needs the rest
    (s7: the same plans on the 41-64-unit cases of `bench_plan_speed.py --random 8`, seeds 0-2)."""

    contend: float = 0.01
    """Groupings whose start is within this fraction of the best start are contenders for the
    lead (`search._contend`): starts are heuristics, and 1% between them says little about
    where a search from them ends (`bench_plan_speed.py --random 8 --seed 0`, r2: the best
    start, a partitioned 22-unit grouping, ends at 0.5770 s with a bound of 0.5749; the 23-unit
    grouping 0.8% behind it ends at 0.5651 s, the 10x search's)."""
    tie: float = 0.001
    """Contenders whose polished starts are within this fraction of the best are tied, and the
    one of most units leads ([Note: contenders for the lead]): finer units leave the MILP and
    the moves more to change."""
    contenders: int = 3
    """At most this many contenders, best start first; none when one of them has more than
    `CONTEND_UNITS` units (it was `FULL_WINDOW_UNITS`: a half polish is about 1 CPU s whatever
    the units, and seed 1's r2 needed a 55-unit contender, [Note: contenders for the lead])."""

    least_starts: bool = True
    """Whether a grouping with a fitting seed still gets the starts from its least-memory schedule
    (`_start`). The budget ladder's rungs (`solve.ladder.rung_effort`) skip them: the rung below
    passed up its schedule of that grouping, grown from the same starts."""

    def lead_effort(self, p: Problem) -> Effort:
        halve = p.n > self.halve_units * self.scale and self.narrow(p) > 0
        return self._replace(local_work=self.local_work // 2) if halve else self


TENFOLD = Effort(scale=10, milp_units=20, light_units=20)
"""The "10x longer search" of bench/bench_plan_speed.py: 10x the nodes, local work and unit
sizes, and, as the quick search had them before s10, a MILP with HiGHS's defaults on every
grouping of up to 200 units (the reference the quick search is measured against must not
shrink with it)."""


def ahead_for(n: int) -> int:
    return n if n <= FULL_WINDOW_UNITS else max(2, 1000 // n)
