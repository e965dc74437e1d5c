"""FSDP2's host work (per unit, per parameter tensor) in a plan's predicted step,
against the closed form; a plan DDP runs pays none of it."""
import dataclasses

import pytest

from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.gpt import GPT
from shardsched.models.spec import PRESETS
from shardsched.plan.schedule import scenario_for
from shardsched.profile.analytic import analytic_profile
from shardsched.sim.timeline import replay
from shardsched.solve.build import make_plan

UNIT, TENSOR = 2e-3, 4e-4


def _step(plan, profile, device) -> float:
    return replay(scenario_for(plan, profile, Cluster(world=2, gpus_per_node=2, device=device))).step_seconds


@pytest.mark.parametrize("strategy,precision,pays", [
    ("full_shard", "fp32", True), ("shard_grad_op", "fp32", True),
    ("replicate", "bf16-mixed", True),  # FSDP2 with a replicate mesh: DTensors
    ("replicate", "fp32", False),  # DDP
])
def test_host_overhead_is_per_unit_plus_per_tensor(strategy, precision, pays):
    quiet = dataclasses.replace(DEVICES["cpu"], unit_overhead_seconds=0.0, tensor_overhead_seconds=0.0,
                                overlap=False)
    busy = dataclasses.replace(quiet, unit_overhead_seconds=UNIT, tensor_overhead_seconds=TENSOR)
    profile = analytic_profile(PRESETS["tiny"], micro_batch=4, seq=128, device=quiet)
    plan = make_plan(profile, Cluster(world=2, gpus_per_node=2, device=quiet), strategy=strategy,
                     precision=precision, fuse=False)
    tensors = sum(len(layer.dims) for layer in profile.layers)
    assert tensors == len(list(GPT(PRESETS["tiny"]).parameters()))  # the profile counts every tensor once
    expected = (len(plan.units) * UNIT + tensors * TENSOR) if pays else 0.0
    assert _step(plan, profile, busy) - _step(plan, profile, quiet) == pytest.approx(expected, rel=1e-9, abs=1e-12)
