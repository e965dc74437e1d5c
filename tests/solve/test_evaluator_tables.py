"""greedy's `Evaluator` ([Note: the evaluator's per-unit tables]) against a copy of the per-unit
loop it replaced (`_reference_moments`): the same floats, bit for bit, on many problems
(strategies of one and two nodes, full and selective checkpointing, accumulation, code-held
outputs, fused and finest groupings of analytic GPTs) and random Choices of each."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from shardsched.core.types import GradSync
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.gpt_config import GPTConfig
from shardsched.profile.analytic import analytic_profile
from shardsched.profile.trace import trace_profile
from shardsched.solve import milp
from shardsched.solve.candidates import Choice, candidate_problems, finest_problem
from shardsched.solve.greedy import Evaluator, least_memory

from ..plan._generated import Spec, build
from ._reference_moments import ReferenceEvaluator
from .test_levers_vs_brute import BLOCKING, MULTI
from .test_milp_vs_brute import CLUSTER, KW, OVERLAP, synth
from .test_selective_vs_brute import synth_sac


def random_choice(p, r: random.Random, ahead: int) -> Choice:
    """Allowed strategies, launches within `milp.windows`, every checkpointing mode offered."""
    fwin, bwin = milp.windows(p.n, ahead)
    st = tuple(r.choice(p.allowed[i]) for i in range(p.n))
    fwd = tuple(r.choice(fwin[i]) for i in range(p.n))
    bwd = tuple(r.choice(bwin[i]) if s.gathers_for_backward else None for i, s in enumerate(st))
    ckpt = tuple(r.choice(p.checkpoint_modes(i) or (False,)) for i in range(p.n))
    return Choice(st, fwd, bwd, ckpt if any(ckpt) else ())


def check(p, r: random.Random, count: int) -> None:
    new, old = Evaluator(p), ReferenceEvaluator(p)
    choices = [least_memory(p)] + [random_choice(p, r, r.choice((1, 2, p.n))) for _ in range(count)]
    for ch in choices:
        want = old.moments(ch)
        got = new.moments(ch)
        assert len(got) == len(want) and all(a == b for a, b in zip(got, want)), (ch, got, want)
        assert new.peak(ch) == old.peak(ch)


def _accumulating(problems: list) -> list:
    return [p._replace(accumulation=k, grad_sync=sync) for p, (k, sync) in
            zip(problems, [(2, GradSync.EVERY), (3, GradSync.LAST), (4, GradSync.EVERY)] * len(problems))]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cluster", [CLUSTER, OVERLAP, MULTI, BLOCKING], ids=["cpu", "overlap", "multi", "blocking"])
def test_synthetic_problems(seed, cluster):
    r = random.Random(seed)
    for prof in (synth(5, seed), synth(6, seed, ckpt_saves=True), synth_sac(4, seed)):
        problems = [p._replace(checkpointable=True) for p in candidate_problems(prof, cluster, **KW)][:12]
        for p in problems + _accumulating(problems[:3]):
            check(p, r, 15)


GPTS = [GPTConfig(vocab=512, layers=4, hidden=64, heads=2, seq=32),
        GPTConfig(vocab=1000, layers=6, hidden=128, heads=4, seq=64, ffn=384, mlp="swiglu", norm="rmsnorm",
                  bias=False, learned_pos=False)]


@pytest.mark.parametrize("cfg", GPTS, ids=["gpt", "llama"])
@pytest.mark.parametrize("cluster", [Cluster(world=8, gpus_per_node=8, device=DEVICES["h100"]),
                                     Cluster(world=16, gpus_per_node=4, device=DEVICES["a100"])],
                         ids=["node", "nodes"])
def test_analytic_gpts(cfg, cluster):
    r = random.Random(cfg.layers + cluster.world)
    prof = analytic_profile(cfg, micro_batch=2, seq=cfg.seq, device=cluster.device)
    problems = [p._replace(checkpointable=True) for p in candidate_problems(prof, cluster, **KW)]
    problems.append(finest_problem(prof, cluster, **KW)._replace(checkpointable=True))
    assert any(p.selective for p in problems)
    for p in problems[:10] + problems[-2:] + _accumulating(problems[-3:]):
        check(p, r, 20)


def test_analytic_gpt_many_units():
    """30-100 units: what the speed-up is for."""
    cfg = GPTConfig(vocab=2048, layers=40, hidden=128, heads=4, seq=64, ffn=384, mlp="swiglu", norm="rmsnorm",
                    bias=False, learned_pos=False)
    cluster = Cluster(world=16, gpus_per_node=8, device=DEVICES["h100"])
    prof = analytic_profile(cfg, micro_batch=2, seq=cfg.seq, device=cluster.device)
    r = random.Random(3)
    big = finest_problem(prof, cluster, **KW)._replace(checkpointable=True)
    assert big.n >= 30
    for p in [big, big._replace(accumulation=2, grad_sync=GradSync.LAST)]:
        check(p, r, 40)


def test_code_held_outputs():
    """A traced U-Net: the calling code holds an encoder's output through a decoder's forward."""
    torch.set_num_threads(1)
    model, inputs = build(Spec(family="cnn", depth=5, width=8, vocab=10, seq=16, batch=2, norm="batch",
                               skip=True, seed=1))
    unet = trace_profile(model, inputs, name="unet", device=DEVICES["cpu"])
    r = random.Random(7)
    problems = [p._replace(checkpointable=True) for p in candidate_problems(unet, CLUSTER, **KW)]
    assert any(Evaluator(p).t.code_units for p in problems)
    for p in problems[:15]:
        check(p, r, 12)
