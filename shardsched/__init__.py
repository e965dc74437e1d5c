"""shardsched: per-layer sharding plans under a memory budget, run on FSDP2.

The library around your own training loop (docs/guide.md, "The library"):

    plan = shardsched.plan_model(model, inputs, world=8, memory_budget="40GiB")   # or load_plan("plan.json")
    shardsched.parallelize(model, plan, mesh=mesh)                                 # FSDP2 per unit, in place

Names are imported on first use (PEP 562), so `import shardsched` stays light: the
command line's `--help` and analytic plans never pay for torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (module, attribute): the whole public surface
_EXPORTS = {
    "plan_model": ("shardsched.api", "plan_model"),
    "load_plan": ("shardsched.api", "load_plan"),
    "parallelize": ("shardsched.runtime.parallelize", "parallelize"),
    "check_plan": ("shardsched.runtime.parallelize", "check_plan"),
    "make_plan": ("shardsched.solve.build", "make_plan"),
    "trace_profile": ("shardsched.profile.trace", "trace_profile"),
    "measure_profile": ("shardsched.profile.measure", "measure_profile"),
    "analytic_profile": ("shardsched.profile.analytic", "analytic_profile"),
    "launch": ("shardsched.train.launcher", "launch"),
    "Plan": ("shardsched.core.types", "Plan"),
    "Cluster": ("shardsched.cost.device", "Cluster"),
    "DEVICES": ("shardsched.cost.device", "DEVICES"),
    "UsageError": ("shardsched.errors", "UsageError"),
}
__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from shardsched.api import load_plan, plan_model
    from shardsched.core.types import Plan
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.errors import UsageError
    from shardsched.profile.analytic import analytic_profile
    from shardsched.profile.measure import measure_profile
    from shardsched.profile.trace import trace_profile
    from shardsched.runtime.parallelize import check_plan, parallelize
    from shardsched.solve.build import make_plan
    from shardsched.train.launcher import launch


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'shardsched' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
