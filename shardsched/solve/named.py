"""Plans a user can name with `--strategy`: auto is never slower than one that fits (issue 27).

[Note: plans a user can name] `--strategy` names a uniform word (every strategy the cluster
offers, with and without `+ckpt` or `+sac`: `solve.baselines.uniform_configs`) and overrides of
layers. The candidates here are every such word, and every such word with ONE override: of one
of its units (the units `make_plan` makes of it: block-size fusion), or of one layer (a layer
fused with others then stands alone: `plan.units.group_layers` cuts the unit there and fuses
again after it), to another strategy and/or checkpointing, each with FSDP2's one-ahead prefetch
as `make_plan` plans it. Over a whole unit the override leaves the grouping as it was, so those
are schedules of a baseline's grouping, which the search space holds
(`search.with_baseline_groupings`); a layer override's grouping is new, and its plans join the
declared space as plans (`solver.search_space.named_plans`). `auto_plan` returns the fastest
fitting plan among the search's result and all of these, so none of them is faster.

Cost: one candidate per (word, unit or layer, strategy and checkpointing): about 18 x 18 per
unit and per fused layer on a multi-node cluster. Each is scored by greedy's `Evaluator` (the
replay, then the peak only when it is faster than the best so far), and a (word, unit) pair is
skipped at once when `Replay.relaxed`, a lower bound on all of its candidates (the unit's
durations at their least, its backward AllGather left out), is not faster than the best so far.
The bound holds because the replay's event loop is built of max and + over durations, with the
launch order fixed by the steps (so every event time is non-decreasing in every duration), and a
collective left out is never later than one launched at the same point: a zero-length AllGather
still waits for the FIFO channel, none does not. Candidates that would run on DDP (every unit
replicate, none checkpointed: a different time model, `Replay._on_ddp`) are scored without it.
"""
from __future__ import annotations

from shardsched.cost.device import Cluster
from shardsched.core.types import Checkpoint, Optimizer, Precision, Strategy
from shardsched.cost.memory import state_bytes
from shardsched.plan.units import ROOT, group_layers, root_strategy, unit_cost, unit_name
from shardsched.profile.types import Profile
from shardsched.sim.scenario import default_launch
from shardsched.solve.baselines import Scored, score, uniform_configs
from shardsched.solve.candidates import Choice, Problem, _allowed, block_params
from shardsched.solve.greedy import Evaluator
from shardsched.solve.replay import Replay


class _Groupings:
    """Problems of groupings given as layer-index groups, unit costs built once per group."""

    def __init__(self, profile: Profile, cluster: Cluster, pins: dict, precision: Precision, optimizer: Optimizer):
        self.profile, self.cluster, self.pins = profile, cluster, pins
        self.precision, self.optimizer = precision, optimizer
        self.selective = all(layer.selective_saved_bytes is not None for layer in profile.layers)
        self._cost: dict[tuple, tuple] = {}

    def problem(self, groups: list[list[int]]) -> Problem:
        layers = self.profile.layers
        costs, sel, allowed = [], [], []
        for g in groups:
            c = self._cost.get(tuple(g))
            if c is None:
                ls = [layers[i] for i in g]
                c = self._cost[tuple(g)] = (unit_cost(ls), unit_cost(ls, Checkpoint.SELECTIVE) if self.selective
                                            else None)
            costs.append(c[0])
            sel.append(c[1])
            a = _allowed([self.pins.get(layers[i].name) for i in g], self.cluster)
            allowed.append(tuple(dict.fromkeys(map(root_strategy, a))) if costs[-1].layers == (ROOT,) else a)
        return Problem(costs=tuple(costs), allowed=tuple(allowed), profile=self.profile, cluster=self.cluster,
                       precision=self.precision, optimizer=self.optimizer, checkpointable=True,
                       selective=tuple(sel) if self.selective else ())


def _word(st: Strategy, mode) -> str:
    return st.label + ("+sac" if mode is Checkpoint.SELECTIVE else "+ckpt" if mode else "")


def _mode(x) -> object:
    """`Choice.ckpt`'s entry as `Problem.checkpoint_modes` spells it."""
    return x if x is Checkpoint.SELECTIVE else bool(x)


def _ddp_but(ch: Choice, i: int) -> bool:
    """Whether every unit but i is replicate and not checkpointed (a candidate may run on DDP)."""
    return all(k is Strategy.REPLICATE and not c for j, (k, c) in enumerate(zip(ch.strategies, ch.ckpt)) if j != i)


def _ddp(ch: Choice) -> bool:
    return all(k is Strategy.REPLICATE for k in ch.strategies) and not any(ch.ckpt)


def _with(ch: Choice, i: int, st: Strategy, m, *, n: int) -> Choice:
    """`ch` with unit i's strategy and checkpointing replaced, its backward AllGather where FSDP2's
    one-ahead prefetch puts it (`sim.scenario.default_launch`)."""
    bwd = max(n, 2 * n - 2 - i) if st.gathers_for_backward else None
    return ch._replace(strategies=ch.strategies[:i] + (st,) + ch.strategies[i + 1:],
                       bwd=ch.bwd[:i] + (bwd,) + ch.bwd[i + 1:], ckpt=ch.ckpt[:i] + (m,) + ch.ckpt[i + 1:])


def word_choice(p: Problem, groups: list[list[int]], per_layer: list[Strategy], mode: Checkpoint) -> Choice:
    """The uniform word's schedule of a grouping: each unit's strategy, checkpointing (never the
    root), FSDP2's one-ahead prefetch."""
    strategies = tuple(per_layer[g[0]] for g in groups)
    fwd, bwd = default_launch(strategies, ahead=1)
    ck = Checkpoint.SELECTIVE if mode is Checkpoint.SELECTIVE else bool(mode)
    return Choice(strategies, fwd, bwd, tuple(ck if p.can_checkpoint(i) else False for i in range(p.n)))


def named_variants(profile: Profile, cluster: Cluster, *, pins: dict, precision: Precision, optimizer: Optimizer):
    """(strategy, checkpointing, per-layer strategies, groups, overridden unit index or None) of every
    named plan family: for each uniform word its own grouping with each unit free, and, for each
    layer fused with others, the grouping that layer's override makes with that layer's unit free.
    Per-layer strategies: pins kept. Groupings depend on which layers share a strategy only, so
    they are computed once per such pattern."""
    block = block_params(cluster, precision, optimizer)
    layers = profile.layers
    cache: dict[tuple, list[list[int]]] = {}

    def grouped(per_layer: list, j: int | None) -> list[list[int]]:
        first: dict = {}
        pattern = tuple(first.setdefault(s, i) for i, s in enumerate(per_layer))
        if (pattern, j) not in cache:
            marked = [(s, i == j) for i, s in zip(range(len(pattern)), pattern)]
            cache[(pattern, j)] = group_layers(profile, marked, block_params=block)
        return cache[(pattern, j)]

    for strategy, mode in uniform_configs(cluster):
        per_layer = [root_strategy(pins.get(layer.name) or strategy) if layer.name == ROOT
                     else pins.get(layer.name) or strategy for layer in layers]
        groups = grouped(per_layer, None)
        yield strategy, mode, per_layer, groups, None
        alone = {g[0] for g in groups if len(g) == 1}
        for j, layer in enumerate(layers):
            if layer.name == ROOT or j in alone:
                continue  # the root: no key names it; a layer alone in its unit: a unit override
            split = grouped(per_layer, j)
            yield strategy, mode, per_layer, split, next(u for u, g in enumerate(split) if j in g)


def unit_bytes(p: Problem, i: int, k: Strategy) -> int:
    """More than unit i adds to any moment of the step under strategy k (the word's), whatever its
    checkpointing or launches: twice its persistent shard and its gathered parameters, gradients
    and reduction buffer, and twice every activation, input, output, workspace and held figure of
    its plain and selective forms. A schedule with only unit i changed peaks no lower than the
    word's peak less this ([Note: plans a user can name]; tests/solve/test_named.py checks the
    pruned pass against every plan enumerated)."""
    from shardsched.cost.strategy import shard_count

    sb, c = state_bytes(p.precision, p.optimizer), p.costs[i]
    n = shard_count(k, p.cluster)
    states = c.shard_numel(n) * (sb.param + sb.grad + sb.optimizer) \
        + c.padded_numel(n) * (sb.unsharded_param + sb.unsharded_grad + sb.reduce)
    forms = [c] + ([p.selective[i]] if p.selective else [])
    act = sum(f.activation_bytes + f.workspace_bytes + f.lead_activation_bytes + f.input_bytes + f.entry_bytes
              + f.exit_bytes + f.checkpointed_lead_bytes + f.outside_workspace_bytes + f.outside_activation_bytes
              + f.outside_input_bytes + f.code_held_bytes + sum(b.out + b.inp + b.held + b.code for b in f.layer_bytes)
              for f in forms)
    return 2 * (2 * states + act)


def one_override_plans(profile: Profile, cluster: Cluster, *, pins: dict, precision: Precision,
                       optimizer: Optimizer, budget: int, best: float,
                       word_peaks: dict[str, int] | None = None) -> tuple[Scored | None, int]:
    """The fastest fitting uniform word with at most one override (of a unit or a layer) that is
    faster than `best` (None: none is), and how many plans were considered. `word_peaks`: each
    uniform word's peak (`solve.baselines`), where known: a unit override of a word that peaks
    above the budget by more than the unit can free (`unit_bytes`) is skipped."""
    build = _Groupings(profile, cluster, pins, precision, optimizer)
    word_peaks = word_peaks or {}
    found, count, problems, replays, evaluators, shared = None, 0, {}, {}, {}, {}
    for strategy, mode, per_layer, groups, split in named_variants(profile, cluster, pins=pins, precision=precision,
                                                                  optimizer=optimizer):
        k = tuple(map(tuple, groups))
        if k not in problems:
            problems[k] = build.problem(groups)
        p = problems[k]
        if mode is Checkpoint.SELECTIVE and not p.selective:
            continue  # the profile does not say what selective checkpointing keeps
        ch = word_choice(p, groups, per_layer, mode)
        word = strategy.label + mode.suffix
        units = range(p.n) if split is None else (split,)
        durations = delays = None
        for i in units:
            if p.costs[i].layers == (ROOT,):
                continue
            same = (ch.strategies[i], _mode(ch.ckpt[i]))
            # the word's own choice: the uniform plan (`make_plan` fuses a layer given its own word)
            options = [(st, m) for st in p.allowed[i] for m in (p.checkpoint_modes(i) or (False,)) if (st, m) != same]
            count += len(options)
            if not options:
                continue
            if k not in replays:
                replays[k] = Replay(p, shared)
                durations = delays = None
            rp = replays[k]
            ddp = _ddp_but(ch, i)
            if split is None and word in word_peaks and word_peaks[word] - unit_bytes(p, i, ch.strategies[i]) > budget \
                    and not ddp:
                continue  # no change of this unit brings the word within the budget
            if durations is None:
                durations, delays = rp.durations(ch), rp.prefix_delays(ch) if rp.share else None
            if rp.relaxed(ch, i, tuple(dict.fromkeys(st for st, _ in options)), durations, delays) >= best:
                options = [o for o in options if ddp and _ddp(_with(ch, i, *o, n=p.n))]  # not so bounded
            elif split is not None and not ddp:  # the word's own peak in this grouping, then as above
                if k not in evaluators:
                    evaluators[k] = Evaluator(p)
                if evaluators[k].peak(ch) - unit_bytes(p, i, ch.strategies[i]) > budget:
                    continue
            for st in dict.fromkeys(st for st, _ in options):
                mine = [o for o in options if o[0] is st]
                cand = _with(ch, i, st, mine[0][1], n=p.n)
                if len(mine) > 1 and not _ddp(cand) and rp.relaxed(cand, i, (st,), delays=delays) >= best:
                    continue  # this strategy, whatever the checkpointing
                for _, m in mine:
                    cand = _with(ch, i, st, m, n=p.n)
                    if rp.seconds(cand) >= best:
                        continue
                    if k not in evaluators:
                        evaluators[k] = Evaluator(p)
                    if evaluators[k].peak(cand) <= budget:
                        keys = "".join(f",{name}={_word(st, m)}" for name in p.costs[i].layers)
                        scored = score(word + keys, p, cand)
                        if scored.peak <= budget and scored.seconds < best:
                            found, best = scored, scored.seconds
    return found, count


__all__ = ["one_override_plans", "named_variants", "word_choice", "unit_name"]
