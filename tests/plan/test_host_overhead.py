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


# ---------------------------------------------------------------- host time per operator

OP, REC, SAC = 60e-6, 40e-6, 70e-6


def _block_costs(device):
    """A Llama-style block's unit cost, plain and selective (`plan.units.unit_cost`)."""
    from shardsched.core.types import Checkpoint
    from shardsched.models.gpt_config import GPTConfig
    from shardsched.plan.units import unit_cost
    cfg = GPTConfig(layers=2, hidden=256, heads=4, vocab=512, seq=128, norm="rmsnorm", mlp="swiglu", bias=False,
                    learned_pos=False)
    block = analytic_profile(cfg, micro_batch=1, seq=128, device=device).layers[1]
    return unit_cost([block]), unit_cost([block], Checkpoint.SELECTIVE)


@pytest.mark.parametrize("overlap", [True, False])
def test_host_time_per_operator_closed_form(overlap):
    """[Note: host time per op]: with kernels beside the host (a GPU) each phase takes the slower
    of the two, on a CPU their sum; a third of the plain host time in forward, two thirds in
    backward, the recomputation its own, selective checkpointing's dispatch on top of it."""
    from shardsched.plan.schedule import with_host_overhead
    device = dataclasses.replace(DEVICES["h100"], overlap=overlap, unit_overhead_seconds=UNIT,
                                 tensor_overhead_seconds=TENSOR, op_host_seconds=OP,
                                 recompute_op_host_seconds=REC, sac_op_host_seconds=SAC)
    plain, selective = _block_costs(device)
    ops = plain.forward_ops
    # the HF Llama layer's 75 with GPU's fused RMSNorm (2 operators, not 7): [Note: operators per layer
    # in analytic profiles]
    assert ops == selective.forward_ops == 65
    join = max if overlap else (lambda a, b: a + b)
    half = (UNIT + TENSOR * len(plain.dims)) / 2
    got = with_host_overhead(plain, Cluster(world=2, gpus_per_node=2, device=device))
    assert got.forward_seconds == pytest.approx(join(plain.forward_seconds, half + ops * OP / 3))
    assert got.backward_seconds == pytest.approx(join(plain.backward_seconds, half + ops * OP * 2 / 3))
    assert got.recompute() == pytest.approx(join(plain.forward_seconds, ops * REC))
    sel = with_host_overhead(selective, Cluster(world=2, gpus_per_node=2, device=device))
    assert sel.recompute() == pytest.approx(join(selective.recompute(), ops * (REC + SAC)))
    ddp = with_host_overhead(plain, Cluster(world=2, gpus_per_node=2, device=device), fsdp=False)
    assert ddp.forward_seconds == pytest.approx(join(plain.forward_seconds, ops * OP / 3))  # no FSDP2 hooks


def test_kernels_longer_than_the_host_hide_it():
    """On a GPU a block whose kernels outlast its host time is priced by its kernels alone."""
    from shardsched.plan.schedule import with_host_overhead
    device = DEVICES["h100"]
    plain, _ = _block_costs(device)
    slow = dataclasses.replace(plain, forward_seconds=1.0, backward_seconds=2.0)
    got = with_host_overhead(slow, Cluster(world=8, gpus_per_node=8, device=device))
    assert (got.forward_seconds, got.backward_seconds, got.recompute()) == (1.0, 2.0, 1.0)
