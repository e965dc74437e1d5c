"""Issue 27: auto is never slower than a plan `--strategy` can name that fits the same budget.

Named plans: every uniform word (each strategy, with and without `+ckpt` / `+sac`) and every
such word with one of its units overridden (another strategy and/or checkpointing). Here they
are enumerated exhaustively (no pruning) on random small configurations and scored by greedy's
`Evaluator` (equal to the simulator: tests/solve/test_replay.py, test_evaluator_tables.py); a
sample of them is checked against `make_plan` of the spec string itself."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings, strategies as st

from shardsched.core.types import Checkpoint, Optimizer, Precision
from shardsched.cost.device import DEVICES, Cluster
from shardsched.cost.strategy import strategies_for
from shardsched.models.spec import parse_model_spec
from shardsched.plan.spec import parse_strategy_spec
from shardsched.plan.units import ROOT, group_layers, layer_strategies
from shardsched.profile.analytic import analytic_profile
from shardsched.sim.scenario import default_launch
from shardsched.solve.auto import auto_plan, least_memory_peak
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.build import make_plan
from shardsched.solve.greedy import Evaluator
from shardsched.solve.named import one_override_plans
from shardsched.solve.candidates import Choice, block_params, problem_for
from shardsched.solve.search import Effort, key

KW = dict(precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
WEAK = Effort(nodes=1, milp_units=0, lead_units=0, narrow_units=0, local_work=0, contenders=0, bound_units=0)


def _setup(layers, hidden, world, gpn, dev, seq):
    cfg = parse_model_spec(f"gpt:layers={layers},hidden={hidden},heads={hidden // 64},vocab=8000,seq={seq}").config
    prof = analytic_profile(cfg, micro_batch=1, seq=seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


def _word(st, mode) -> str:
    return st.label + ("+sac" if mode is Checkpoint.SELECTIVE else "+ckpt" if mode else "")


def spec_strings(prof, cl) -> list[str]:
    """Every uniform word, and each with one unit (of `make_plan`'s units of it) or one layer
    overridden to another strategy and/or checkpointing."""
    out = []
    for s in uniform_baselines(prof, cl, pins={}, **KW):
        out.append(s.name)
        p = s.problem
        for i in range(p.n):
            if p.costs[i].layers == (ROOT,):
                continue
            keys = [p.costs[i].layers] + ([(name,) for name in p.costs[i].layers] if len(p.costs[i].layers) > 1 else [])
            for names in keys:
                for st_ in strategies_for(cl):
                    for mode in (False, True, Checkpoint.SELECTIVE):
                        spec = s.name + "".join(f",{name}={_word(st_, mode)}" for name in names)
                        if _word(st_, mode) != s.name:
                            out.append(spec)
    return out


def as_planned(prof, cl, spec: str):
    """(Problem, Choice) of `make_plan(strategy=spec)`, as build.make_plan makes its units."""
    sp = parse_strategy_spec(spec)
    names = [layer.name for layer in prof.layers]
    per_layer, ckpt = sp.for_layers(names), sp.checkpointed(names)
    strategies = layer_strategies(prof, [per_layer[n] for n in names])
    keys = [(k, ckpt[n] if n != ROOT else Checkpoint.NONE) for k, n in zip(strategies, names)]
    groups = group_layers(prof, keys, block_params=block_params(cl, **KW))
    p = problem_for(groups, [(layer, layer.name) for layer in prof.layers], [None] * len(names), profile=prof,
                    cluster=cl, **KW)._replace(checkpointable=True)
    strats = tuple(keys[g[0]][0] for g in groups)
    fwd, bwd = default_launch(strats, ahead=1)
    ck = tuple(Checkpoint.SELECTIVE if keys[g[0]][1] is Checkpoint.SELECTIVE else bool(keys[g[0]][1]) for g in groups)
    return p, Choice(strats, fwd, bwd, ck)


def named_scores(prof, cl) -> list[tuple[float, int, str]]:
    evs, out = {}, []
    for spec in spec_strings(prof, cl):
        p, ch = as_planned(prof, cl, spec)
        ev = evs.setdefault(key(p), Evaluator(p))
        out.append((ev.seconds(ch), ev.peak(ch), spec))
    return out


CONFIG = st.tuples(st.integers(2, 6), st.sampled_from([256, 512, 1024]), st.sampled_from([8, 16, 64]),
                   st.sampled_from([4, 8]), st.sampled_from(["a100", "h100"]), st.sampled_from([256, 1024]),
                   st.floats(0.0, 1.0), st.integers(0, 2**16))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(CONFIG)
def test_auto_is_never_slower_than_a_plan_you_can_name(config):
    layers, hidden, world, gpn, dev, seq, where, seed = config
    prof, cl = _setup(layers, hidden, world, gpn, dev, seq)
    scored = named_scores(prof, cl)
    least = least_memory_peak(prof, cl, **KW)
    top = max(peak for _, peak, _ in scored)
    budget = int(least + where * (top - least))
    # a weak search (no MILP, no local search) too: the rule must hold whatever the search finds
    effort = Effort() if seed % 2 else WEAK
    plan = auto_plan(prof, cl, spec=parse_strategy_spec("auto"), memory_budget_bytes=budget, effort=effort, **KW)
    assert plan.predicted.peak_bytes <= budget
    fitting = [(t, spec) for t, peak, spec in scored if peak <= budget]
    if fitting:
        t, spec = min(fitting)
        assert plan.predicted.step_seconds <= t * (1 + 1e-12), (spec, t, plan.predicted.step_seconds)
    # the candidates are what `--strategy` gives: a sample checked against make_plan of the string
    rng = random.Random(seed)
    for t, peak, spec in rng.sample(scored, 3):
        named = make_plan(prof, cl, strategy=spec, **KW)
        assert abs(named.predicted.step_seconds - t) <= 1e-9 * t and named.predicted.peak_bytes == peak, spec


def test_the_pruned_search_finds_the_fastest_named_plan():
    """`one_override_plans` (with its lower bound) finds what the exhaustive enumeration finds."""
    rng = random.Random(3)
    checked = 0
    for _ in range(6):
        prof, cl = _setup(rng.randint(2, 5), rng.choice([256, 512]), rng.choice([16, 64]), 8, "a100", 512)
        scored = named_scores(prof, cl)
        ordered = sorted(peak for _, peak, _ in scored)
        for budget in (ordered[len(ordered) // 4], ordered[len(ordered) // 2], ordered[-1]):
            fitting = [t for t, peak, _ in scored if peak <= budget]
            ref = max(fitting)  # the slowest fitting one: every faster named plan must be found
            peaks = {s.name: s.peak for s in uniform_baselines(prof, cl, pins={}, **KW)}
            found, _ = one_override_plans(prof, cl, pins={}, budget=budget, best=ref * (1 + 1e-9), word_peaks=peaks,
                                          **KW)
            assert found is not None and abs(found.seconds - min(fitting)) <= 1e-12 * ref
            checked += 1
    assert checked == 18
