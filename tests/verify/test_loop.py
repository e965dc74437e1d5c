"""The closed loop (`shardsched.verify.loop`, [Note: the closed loop]): an auto plan whose
verified peak is over its budget is planned again below it; one the prediction over-charges
is planned again above it; nothing is returned over budget; the answer is deterministic."""
from __future__ import annotations

import dataclasses
import re

import pytest

from shardsched.api import plan_model
from shardsched.cost.bytes import parse_bytes
from shardsched.cost.device import DEVICES, Cluster
from shardsched.cost.headroom import headroom_for, usable_budget
from shardsched.errors import UsageError
from shardsched.profile.trace import trace_profile
from shardsched.solve.build import make_plan
from shardsched.verify.engine import verify_plan
from shardsched.verify.loop import ROUNDS, closed_loop

from . import user_models as um

MiB = 1 << 20


def _setup(build=um.build_vit, world=4):
    model, inputs = build()
    profile = trace_profile(model, inputs, name="m", device=DEVICES["cpu"])
    cluster = Cluster(world=world, gpus_per_node=world, device=DEVICES["cpu"])

    def replan(budget):
        return make_plan(profile, cluster, strategy="auto", memory_budget_bytes=budget)
    return model, inputs, replan


def test_an_over_charged_model_gets_the_memory_its_prediction_left_unused():
    """The ViT of nn.TransformerEncoderLayer is predicted above what it allocates: the loop
    plans it again higher, and the answer is never slower than the open-loop plan."""
    model, inputs, replan = _setup()
    usable = 13 * MiB
    open_loop = replan(usable)
    closed = closed_loop(open_loop, verify=lambda p: verify_plan(model, inputs, p), replan=replan, usable=usable,
                         analytic=False)
    assert closed.verified.peak_bytes <= usable
    assert closed.predicted.step_seconds <= open_loop.predicted.step_seconds


def test_an_under_predicted_model_is_planned_below_the_budget():
    """The rule in closed form: a model whose verified peak is over the budget (here the engine's
    peak plus a fixed extra stands for an allocation no moment foresaw: the first plan's
    verified peak lands 1 MiB over) is planned again at min(U - m, U - (V - U)), and the
    answer's verified peak fits U."""
    model, inputs, replan = _setup()
    usable = 14 * MiB
    extra = usable + MiB - verify_plan(model, inputs, replan(usable)).peak_bytes
    budgets = []

    def replan_logged(b):
        budgets.append(b)
        return replan(b)

    def verify(p):
        v = verify_plan(model, inputs, p)
        return dataclasses.replace(v, peak_bytes=v.peak_bytes + extra)
    first = replan(usable)
    closed = closed_loop(first, verify=verify, replan=replan_logged, usable=usable, analytic=False)
    assert closed.verified.peak_bytes <= usable
    assert len(budgets) <= ROUNDS - 1
    miss = verify(first).peak_bytes - first.predicted.peak_bytes
    assert budgets[0] == min(usable - miss, usable - (verify(first).peak_bytes - usable))
    assert any("planned again after verification" in n for n in closed.notes)


def test_nothing_over_the_budget_is_returned():
    model, inputs, replan = _setup()

    def verify(p):  # a miss larger than the budget: nothing can fit
        v = verify_plan(model, inputs, p)
        return dataclasses.replace(v, peak_bytes=v.peak_bytes + 100 * MiB)
    with pytest.raises(UsageError, match="no plan this search could verify fits the usable budget"):
        closed_loop(replan(14 * MiB), verify=verify, replan=replan, usable=14 * MiB, analytic=False)


def test_the_budget_the_refusal_advises_is_accepted_when_passed():
    """The refusal quotes a --memory-budget (the least verified peak under the device's default
    headroom); passed back, with the same engine, the loop returns a plan that fits it."""
    model, inputs, replan = _setup()

    def verify(p):  # every plan verifies 20 MiB over its prediction: 14 MiB cannot hold one
        v = verify_plan(model, inputs, p)
        return dataclasses.replace(v, peak_bytes=v.peak_bytes + 20 * MiB)
    with pytest.raises(UsageError) as e:
        closed_loop(replan(14 * MiB), verify=verify, replan=replan, usable=14 * MiB, analytic=False)
    given = re.search(r"--memory-budget (\S+) or more", str(e.value)).group(1)
    usable = usable_budget(parse_bytes(given), device_memory=DEVICES["cpu"].memory_bytes,
                           headroom=headroom_for(None, DEVICES["cpu"])).usable
    assert usable > 14 * MiB + 20 * MiB - 4 * MiB  # the least peak, not a generous round figure
    plan = closed_loop(replan(usable), verify=verify, replan=replan, usable=usable, analytic=False)
    assert plan.verified.peak_bytes <= usable


def test_the_loop_is_deterministic_and_no_verify_says_so():
    model, inputs = um.build_vit()
    a = plan_model(model, inputs, world=4, memory_budget="13MiB", headroom="0")
    b = plan_model(model, inputs, world=4, memory_budget="13MiB", headroom="0")
    strip = lambda p: dataclasses.replace(p, solver=dataclasses.replace(p.solver, seconds=0))
    assert strip(a).to_json() == strip(b).to_json()
    c = plan_model(model, inputs, world=4, memory_budget="13MiB", headroom="0", verify=False)
    assert c.verified is None and any("not verified (--no-verify)" in n for n in c.notes)
