"""The closed loop: plans whose verified peak is over the budget are planned again.

[Note: the closed loop]
The planner fits the *predicted* peak P to the usable budget U; the engine then measures the
plan's peak V (`verify.engine`). The miss m = V - P is a property of the model more than of
the plan (a fused RNN kernel's workspace, a fast path that saves more than it says), so an
auto plan is planned again at the budget U - m: a plan that fits there predicts P' <= U - m
and measures V' ~ P' + m <= U. The other way works alike: a model the prediction
over-charges (m < 0) is planned again at U - m > U, so the search may use the memory the
prediction left unused. At most `ROUNDS` plans are made and verified, each at a budget that
depends only on the inputs and the earlier rounds, so the loop is deterministic; the answer
is the fastest plan whose *verified* peak fits U, or one line saying that nothing the loop
could verify fits. Plans of a named strategy are not planned again: their verified peak is
stated beside the prediction, with a warning when it is over the budget.

[Note: a plan the engine cannot run]
A step can fail under the engine where the model and a mechanism disagree: torch's selective
checkpointing refuses an in-place op on an output its policy saved (Mixtral's router divides
topk's weights in place), and verification says so (`verify.subject.PlanFails`). A named
strategy is refused in one line. An auto plan that checkpoints selectively is planned again
with `+sac` out of the space (`Profile.without_selective`), and so are the loop's later rounds;
its note says why. Only a failure of that plan too is refused.

[Note: what the CPU verifies of a GPU plan]
Verification runs CPU kernels (fake tensors dispatch as CPU kernels do). A traced profile
(`hf:`, `python:`) is taken on the same kernels, so prediction and verification describe one
program on any `--device`. An analytic profile of a GPT config on a GPU device prices what
GPU kernels save (fused RMSNorm, flash attention), which the CPU program saves more of; there
the verified figure is stated as the CPU program's and the loop does not move the budget.
"""
from __future__ import annotations

from typing import Callable

import dataclasses
import functools

from shardsched._fmt import fmt_bytes
from shardsched.core.types import Plan, Verified
from shardsched.errors import UsageError

ROUNDS = 3
"""Plans made and verified at most, the first included."""
OVER_CHARGED = 0.01
"""A verified peak this share of the budget below the prediction is planned again upward."""


def attach(plan: Plan, verified: Verified) -> Plan:
    """`plan` with its verification (the plan table prints it beside the prediction)."""
    return dataclasses.replace(plan, verified=verified)


def comparable(plan: Plan, analytic: bool) -> bool:
    """Whether the verified peak measures the program the prediction priced
    ([Note: what the CPU verifies of a GPU plan])."""
    return not analytic or plan.device == "cpu"


def closed_loop(plan: Plan, *, verify: Callable[[Plan], Verified], replan: Callable[[int], Plan] | None,
                usable: int | None, analytic: bool) -> Plan:
    """See [Note: the closed loop]. `replan(budget)` makes the plan again at another planning
    budget (None: a named strategy); `usable` is the budget the answer must fit (None: none given)."""
    first, replan, note = _first_run(plan, verify=verify, replan=replan, usable=usable)
    checked = [(first, usable)]
    if replan is None or usable is None or not comparable(plan, analytic):
        return _noted(first, note)
    for _ in range(ROUNDS - 1):
        last, budget = checked[-1]
        peak = last.verified.peak_bytes
        miss = peak - last.predicted.peak_bytes
        if peak <= usable and miss > -OVER_CHARGED * usable:
            break  # fits, and the prediction left little unused
        # Over: strictly below the last budget; over-charged: up by what the prediction over-charged.
        nxt = min(usable - miss, budget - (peak - usable)) if peak > usable else usable - miss
        if nxt <= 0 or any(b == nxt for _, b in checked):
            break
        try:
            again = replan(nxt)
        except UsageError:  # nothing fits the smaller planning budget
            break
        checked.append((attach(again, verify(again)), nxt))
    return _noted(_answer(checked, usable), note)


def _first_run(plan: Plan, *, verify, replan, usable: int | None) -> tuple[Plan, Callable | None, str | None]:
    """`plan` verified, the `replan` later rounds use and a note; an auto plan that checkpoints
    selectively and fails under the engine is planned again without `+sac` ([Note: a plan the
    engine cannot run])."""
    from shardsched.verify.subject import PlanFails
    try:
        return attach(plan, verify(plan)), replan, None
    except PlanFails as failed:
        if replan is None or not any(u.checkpoint.selective for u in plan.units):
            raise
        replan = functools.partial(replan, selective=False)
        try:
            again = replan(usable)
            return attach(again, verify(again)), replan, (
                f"planned without selective checkpointing (+sac): the plan that used it failed under the "
                f"engine ({failed.cause})")
        except (PlanFails, UsageError):
            raise failed from None


def _noted(plan: Plan, note: str | None) -> Plan:
    return plan if note is None else dataclasses.replace(plan, notes=plan.notes + (note,))


def _answer(checked: list[tuple[Plan, int]], usable: int) -> Plan:
    """The fastest verified plan that fits `usable`; one line when none does."""
    fits = [p for p, _ in checked if p.verified.peak_bytes <= usable]
    if not fits:
        low = min((p for p, _ in checked), key=lambda p: p.verified.peak_bytes)
        raise UsageError(f"no plan this search could verify fits the usable budget {fmt_bytes(usable)}: the least "
                         f"verified peak was {fmt_bytes(low.verified.peak_bytes)} (predicted "
                         f"{fmt_bytes(low.predicted.peak_bytes)}); accepted: {_advice(low)}, a larger "
                         f"world, or a smaller micro-batch")
    best = min(fits, key=lambda p: p.predicted.step_seconds)
    if len(checked) > 1:
        first = checked[0][0]
        budgets = ", ".join(fmt_bytes(b) for _, b in checked[1:])
        best = dataclasses.replace(best, notes=best.notes + (
            f"planned again after verification ({len(checked)} plans verified, planning budgets {budgets}): "
            f"the first plan's verified peak was {fmt_bytes(first.verified.peak_bytes)} against its predicted "
            f"{fmt_bytes(first.predicted.peak_bytes)}",))
    return best


def _advice(low: Plan) -> str:
    """The --memory-budget whose usable part under the device's default headroom holds the least
    verified peak (a plan that verified there is then among what the loop can return), as the
    too-small message quotes one (`solve.auto.given_budget`)."""
    from shardsched.cost.device import DEVICES
    from shardsched.solve.auto import given_budget
    device = DEVICES.get(low.device)
    if device is None:
        return "a larger --memory-budget"
    given, headroom = given_budget(low.verified.peak_bytes, device)
    return (f"--memory-budget {given} or more ({fmt_bytes(low.verified.peak_bytes)} usable after the "
            f"device's default --headroom {headroom.text})")


def checked_plan(plan: Plan, *, subject, replan: Callable[[int], Plan] | None, usable: int | None,
                 analytic: bool, enabled: bool = True) -> Plan:
    """The plan to return: verified and corrected by `closed_loop`, or `plan` with one note
    saying why it is not verified (`--no-verify`; a model the engine cannot run here)."""
    from shardsched.verify.subject import Unverifiable, verifier
    if not enabled:
        return dataclasses.replace(plan, notes=plan.notes + ("not verified (--no-verify): the peak is the "
                                                             "prediction alone",))
    try:
        return closed_loop(plan, verify=verifier(subject), replan=replan, usable=usable, analytic=analytic)
    except Unverifiable as e:
        return dataclasses.replace(plan, notes=plan.notes + (f"not verified: {e}",))
