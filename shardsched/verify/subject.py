"""What verification runs a plan on: the model the profile was taken from, or the model
rebuilt from its `--model` spec at the plan's shape.

[Note: models that cannot run on fake tensors]
A model whose own code reads tensor values (a loss over `logits[mask]`, `.item()`, CTC's
input lengths) cannot run on fake tensors: the op raises a data-dependent error. It is then
verified on real tensors on this machine, as the oracle tests measure (FSDP2 on the fake
process group, FSDPMemTracker), and the plan says so (`Verified.tensors` "real"). A model
profiled on the meta device is built for real first, when its parameters, gradients and
Adam state (16 bytes a parameter) fit in a quarter of this machine's memory; otherwise the
plan is returned unverified, with one note saying why.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import Any, Callable, NamedTuple

from shardsched._json import from_dict, to_dict
from shardsched.core.types import Plan, Verified
from shardsched.errors import UsageError

_DATA_DEPENDENT = ("DataDependentOutput", "DynamicOutputShape", "data-dependent", "UnsupportedOperatorException",
                   "_local_scalar_dense", "nonzero")


class Subject(NamedTuple):
    """A model to verify plans on, and how to build it again."""

    model: Any
    """The profiled model (real, or on the meta device), or None: built by `build`."""
    inputs: tuple
    build: Callable[..., tuple[Any, tuple]]
    """build(micro_batch=, seq=, real=) -> (model, inputs) at another shape, or on real tensors."""
    recipe: dict | None = None
    """{"model": --model spec, "layers": --layers}: how a fresh interpreter rebuilds the model,
    for a caller with a process group of its own (`verify_elsewhere`); None: always in-process."""


def data_dependent(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return any(k in text for k in _DATA_DEPENDENT)


def _host_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _on_meta(model) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


def model_for(subject: Subject, plan: Plan) -> tuple[Any, tuple]:
    """The subject's model and inputs at the plan's micro-batch and sequence."""
    from shardsched.profile.measure import batch_and_seq
    if subject.model is not None and tuple(batch_and_seq(subject.inputs)) == (plan.micro_batch, plan.seq):
        return subject.model, subject.inputs
    return subject.build(micro_batch=plan.micro_batch, seq=plan.seq or None, real=False)


def verifier(subject: Subject) -> Callable[[Plan], Verified]:
    """verify(plan) -> Verified: on fake tensors, or for real when the model needs values
    ([Note: models that cannot run on fake tensors]); raises `Unverifiable` when neither can.
    A plan that runs as one verified before (the same units at another budget: a sweep's
    budgets above the point where more memory stops helping) is not run again."""
    seen: dict[str, Verified] = {}

    def verify(plan: Plan) -> Verified:
        key = executed(plan).to_json()
        if key not in seen:
            seen[key] = _verify(subject, plan)
        return seen[key]
    return verify


def executed(plan: Plan) -> Plan:
    """`plan` less what does not change the run the engine makes of it: the budget it was
    fitted to, its predictions, the solver's record and its notes."""
    import dataclasses

    from shardsched.core.types import Predicted, SolverInfo
    return dataclasses.replace(plan, memory_budget_bytes=None, usable_budget_bytes=None, headroom_bytes=0,
                               predicted=Predicted(), solver=SolverInfo(), notes=(), verified=None,
                               strategy_spec="")


def _verify(subject: Subject, plan: Plan) -> Verified:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():  # [Note: the fake world is this process's own]
        if subject.recipe is None:
            raise Unverifiable("this process holds a process group and the model has no --model spec "
                               "to verify it elsewhere")
        return verify_elsewhere(subject.recipe, plan)
    model, inputs = model_for(subject, plan)
    return _cached(model, inputs, plan, lambda: _verify_here(subject, plan, model, inputs))


def _cached(model, inputs: tuple, plan: Plan, run: Callable[[], Verified]) -> Verified:
    """`run()` through the profile cache, keyed by the model and the plan ([Note: the profile
    cache] in profile/cache.py: a second plan of a model makes no fake tensors). A model built
    from its spec (a preset, on the meta device) is keyed as built: the same spec, shape and code
    give the same key, so a second `plan` of llama-7b skips its 11 CPU s run."""
    from shardsched.profile import cache
    key = cache.model_key(model, inputs, executed(plan).to_json())
    return cache.cached("verified", key, run, to_text=lambda v: json.dumps(to_dict(v)),
                        from_text=lambda t: from_dict(Verified, json.loads(t)))


def _verify_here(subject: Subject, plan: Plan, model, inputs: tuple) -> Verified:
    """One fake (or, for data-dependent models, real) run of `plan` in this process, on
    `model_for(subject, plan)`."""
    from shardsched.verify.engine import verify_plan
    try:
        return verify_plan(model, inputs, plan)
    except Exception as e:  # noqa: BLE001 - only data-dependent ops go on to a real run
        if not data_dependent(e):
            raise PlanFails.of(e, plan) from None
    if _on_meta(model):
        params = sum(p.numel() for p in model.parameters())
        if 16 * params > _host_bytes() // 4:
            raise Unverifiable(f"its code reads tensor values (data-dependent ops) and its {params:,} "
                               f"parameters are too large to run for real on this machine")
        model, inputs = subject.build(micro_batch=plan.micro_batch, seq=plan.seq or None, real=True)
    try:
        return verify_plan(copy.deepcopy(model), inputs, plan, tensors="real")
    except Exception as e:  # noqa: BLE001 - the step fails on real tensors too: refused in one line
        raise PlanFails.of(e, plan, tensors="real") from None


class Unverifiable(Exception):
    """The plan cannot be run by the engine here; the message says why (one line)."""


class PlanFails(UsageError):
    """One step of the plan fails under the engine (criterion 3 of issue 26: never a plan that
    fails at its first step): refused in one line, the engine's own words in it."""

    cause: str = ""
    """The engine's error in a few words (`verify.loop` quotes it in a plan's note)."""

    @classmethod
    def of(cls, e: Exception, plan: Plan, *, tensors: str = "fake") -> "PlanFails":
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        failed = cls(f"the plan fails at its first step under the engine (one step on {tensors} tensors at world "
                     f"{plan.world}: {type(e).__name__}: {msg[:240]}); accepted: a model whose forward and backward "
                     f"run under FSDP2's fully_shard (or DDP for --strategy replicate), or --no-verify to write "
                     f"the plan without running it")
        failed.cause = f"{type(e).__name__} on {tensors} tensors: {msg[:240]}"
        return failed


class Recipe(dict):
    """{"model": spec string, "layers": --layers or None, "position_table": train's GPT table
    or None}: how a child rebuilds the model."""


def verify_elsewhere(recipe: Recipe, plan: Plan) -> Verified:
    """Run `python -m shardsched.verify.worker` on `plan`; its `Verified`, or the child's last
    error line raised as `verify.subject.Unverifiable`."""
    request = json.dumps({**recipe, "plan": to_dict(plan)})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "shardsched.verify.worker"], input=request, text=True,
                          capture_output=True, env=env, check=False)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise Unverifiable(f"the verifying process failed ({lines[-1][:200] if lines else done.returncode})")
    return from_dict(Verified, json.loads(done.stdout.strip().splitlines()[-1]))
