"""The accumulation term in the MILP's memory rows and greedy's evaluator equals the simulator's.

Same check as `test_milp_vs_brute.test_memory_rows_and_evaluator_match_simulator`, on
problems whose step accumulates 2 or 3 micro-batches, with gradients reduced after every
one or only after the last ([Note: accumulation memory] in sim/memory.py).
"""
import random

import pytest

from shardsched.core.types import GradSync
from shardsched.sim.memory import step_memory
from shardsched.solve import milp
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator

from .test_milp_vs_brute import CLUSTER, KW, check_rows_and_evaluator, random_choice, synth


@pytest.mark.parametrize("sync", list(GradSync))
@pytest.mark.parametrize("k", [2, 3])
def test_rows_and_evaluator_match_simulator_with_accumulation(k, sync):
    r = random.Random(11)
    for p in candidate_problems(synth(5, 5), CLUSTER, **KW)[:3]:
        acc = p._replace(accumulation=k, grad_sync=sync)
        b, ev = milp._Build(acc, budget=1 << 40, ahead=acc.n, t_ub=None), Evaluator(acc)
        for _ in range(10):
            ch = random_choice(acc, r)
            check_rows_and_evaluator(acc, b, ev, ch)
            # the term is there: every forward and backward moment holds more than without it
            once = [m.total for m in step_memory(p.scenario(ch))]
            more = [m.total for m in step_memory(acc.scenario(ch))]
            assert all(a > b for a, b in zip(more[:-1], once[:-1])) and more[-1] == once[-1]


def test_step_time_of_k_micro_batches():
    """K forward-backward passes and one optimizer step; with gradients kept until the last
    micro-batch, K-1 of them run without reductions (closed forms over the replayed timeline)."""
    from shardsched.sim.simulate import simulate
    from shardsched.sim.timeline import replay
    p = candidate_problems(synth(5, 5), CLUSTER, **KW)[0]
    ch = random_choice(p, random.Random(3))
    tl = replay(p.scenario(ch))
    opt = tl.compute[-1].end - tl.compute[-1].start
    quiet = replay(p.scenario(ch), reduce=False).compute[-1].start
    assert quiet < tl.compute[-1].start  # the reductions take time on this blocking cluster
    for k in (1, 2, 4):
        every = simulate(p._replace(accumulation=k).scenario(ch)).predicted
        last = simulate(p._replace(accumulation=k, grad_sync=GradSync.LAST).scenario(ch)).predicted
        assert every.step_seconds == pytest.approx(k * tl.compute[-1].start + opt, rel=1e-12)
        assert last.step_seconds == pytest.approx((k - 1) * quiet + tl.compute[-1].start + opt, rel=1e-12)
        assert every.compute_seconds == pytest.approx(k * (tl.compute_seconds - opt) + opt, rel=1e-12)
