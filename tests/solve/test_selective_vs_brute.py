"""Selective checkpointing as a third choice per unit ([Note: three checkpointing modes in the
MILP] in solve/milp/costs.py): the MILP's memory rows, start times and greedy's evaluator equal the
simulator on choices that mix none, full and selective, and the MILP equals brute force over
strategies, launches and the three modes.

Synthetic layers whose selective form keeps some of their activations and recomputes a part of
their forward, so each of the three modes is the best somewhere along the budgets."""
from __future__ import annotations

import dataclasses
import random

import pytest

from shardsched.core.types import Checkpoint, Strategy
from shardsched.profile.types import LayerProfile, Profile
from shardsched.solve import milp
from shardsched.solve.brute import brute
from shardsched.solve.candidates import Choice, candidate_problems
from shardsched.solve.greedy import Evaluator, least_memory

from tests.solve.test_levers_vs_brute import BLOCKING, MULTI
from tests.solve.test_milp_vs_brute import CLUSTER, KW, check_rows_and_evaluator

SAC = Checkpoint.SELECTIVE


def synth_sac(k: int, seed: int) -> Profile:
    """Layers with inputs smaller than their activations, and a selective form between."""
    r = random.Random(seed)
    layers = []
    for i in range(k):
        act = r.randint(10, 60) * 10**6
        inp, fwd = act // r.randint(4, 8), r.uniform(2, 15) * 1e-3
        layers.append(LayerProfile(
            name=f"l{i}", params=r.choice([1, 3, 8]) * r.randint(1, 6) * 10**6, forward_seconds=fwd,
            backward_seconds=r.uniform(4, 30) * 1e-3, activation_bytes=act, input_bytes=inp,
            workspace_bytes=r.randint(1, 20) * 10**6, checkpointed_forward_bytes=r.randint(1, 10) * 10**6,
            selective_saved_bytes=int((act - inp) * r.uniform(0.1, 0.4)),
            selective_forward_bytes=r.randint(5, 20) * 10**6, selective_recompute_seconds=fwd * r.uniform(0.02, 0.1)))
    # a loss after the last layer that reads its saved output (a `+sac` head's logits)
    logits = r.randint(2, 8) * 10**6
    layers[-1] = dataclasses.replace(layers[-1], outside_bytes=logits, outside_workspace_bytes=2 * logits,
                                     activation_bytes=layers[-1].activation_bytes + logits,
                                     selective_outside_input_bytes=logits // 2)
    return Profile(model="synth", layers=tuple(layers), fingerprint="synth", input_bytes=4096)


def _problems(seed: int, cluster, few: tuple | None = None):
    out = []
    for p in candidate_problems(synth_sac(3, seed), cluster, **KW):
        p = p._replace(checkpointable=True)
        assert all(p.can_select(i) for i in range(p.n))
        out.append(p if few is None or p.n < 3 else p._replace(allowed=(few,) * p.n))
    return out


def mixed_choice(p, r: random.Random) -> Choice:
    st = tuple(r.choice(p.allowed[i]) for i in range(p.n))
    fwd = tuple(r.randint(0, i) for i in range(p.n))
    bwd = tuple(r.randint(p.n, 2 * p.n - 1 - i) if s.gathers_for_backward else None for i, s in enumerate(st))
    return Choice(st, fwd, bwd, tuple(r.choice((False, True, SAC)) for _ in range(p.n)))


def test_rows_and_evaluator_match_simulator_with_selective_units():
    r = random.Random(11)
    prof = dataclasses.replace(synth_sac(5, 5))
    for p in candidate_problems(prof, CLUSTER, **KW)[:5]:
        p = p._replace(checkpointable=True)
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(20):
            check_rows_and_evaluator(p, b, ev, mixed_choice(p, r))


def _budgets(p) -> list[int]:
    ev = Evaluator(p)
    lo = ev.peak(least_memory(p))
    hi = ev.peak(Choice((Strategy.REPLICATE,) * p.n, tuple(range(p.n)), (None,) * p.n))
    return [lo + 1, int(lo + 0.02 * (hi - lo)), int(lo + 0.05 * (hi - lo)), int(lo + 0.15 * (hi - lo))]


FEW = (Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD)
"""For 3-unit groupings: brute force over every strategy x three modes x launches is slow."""


@pytest.mark.parametrize("seed,cluster", [(0, MULTI), (1, BLOCKING)], ids=["overlap", "blocking"])
def test_milp_equals_brute_force_with_selective(seed, cluster):
    modes = set()
    for p in _problems(seed, cluster, FEW):
        for budget in _budgets(p):
            b = brute(p, budget=budget)
            r = milp.solve(p, budget=budget)
            assert r.objective == pytest.approx(b.seconds, rel=1e-9)
            if b.choice is not None:
                modes.update(Checkpoint(c) for c in b.choice.ckpt)
    assert SAC in modes  # the third mode is chosen somewhere, so the comparison covers it
