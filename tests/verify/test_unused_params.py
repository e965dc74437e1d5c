"""[Note: parameters a step never uses] (profile/unused.py): a parameter that needs a gradient
but gets none holds no gradient under FSDP2, a bucket slot under DDP, and no optimizer state;
the profile finds them, prediction and verification charge what the engine allocates, against
FSDP2 (or DDP) on real tensors."""
from __future__ import annotations

import copy
import dataclasses

import json
from pathlib import Path

import pytest

from shardsched.core.types import GradSync
from shardsched.cost.device import DEVICES, Cluster
from shardsched.profile.trace import trace_profile
from shardsched.solve.build import make_plan
from shardsched.verify.engine import verify_plan

from shardsched.train.launcher import launch

from .._gloo import within
from ..plan._fsdp2 import measured_peak
from ._worst_worker import worst_worker
from .user_models import SPARE_D as D, build_spare as build

LAYERS = [*(f"blocks.{i}" for i in range(6)), "head", "aux"]


def test_the_profile_counts_each_layers_unused_elements():
    model, inputs = build()
    prof = trace_profile(model, inputs, name="spare", device=DEVICES["cpu"], layers=LAYERS)
    by = {lay.name: lay.unused_params for lay in prof.layers}
    spare = D * 2 * D + 2 * D
    # a module the forward never runs is no layer: its parameters are the root's
    assert by == {"": D + D * 1000 + 1000, **{f"blocks.{i}": spare for i in range(6)}, "head": 0}, by


def test_a_model_that_drops_at_random_is_charged_in_full():
    model, inputs = build()
    model.blocks[3].layerdrop = 0.1  # another step may use what this one skipped
    prof = trace_profile(model, inputs, name="spare", device=DEVICES["cpu"], layers=LAYERS)
    assert all(lay.unused_params == 0 for lay in prof.layers)





def _plan(model, inputs, strategy: str, k: int):
    prof = trace_profile(model, inputs, name="spare", device=DEVICES["cpu"], layers=LAYERS)
    cluster = Cluster(world=4, gpus_per_node=4, device=DEVICES["cpu"])
    acc = (k, GradSync.EVERY) if k > 1 else None
    plan = make_plan(prof, cluster, strategy=strategy, accumulation=acc)
    charged = dataclasses.replace(prof, layers=tuple(dataclasses.replace(lay, unused_params=0) for lay in prof.layers))
    verified = verify_plan(model, inputs, plan)  # attached, as `plan_model` does: DDP learns of them
    return dataclasses.replace(plan, verified=verified), verified, make_plan(charged, cluster, strategy=strategy, accumulation=acc)


@pytest.mark.parametrize("strategy,k", [("full_shard", 1), ("replicate", 1), ("shard_grad_op", 2),
                                        ("full_shard+ckpt", 1), ("replicate", 2)])
def test_predicted_and_verified_are_what_the_engine_allocates(strategy, k):
    model, inputs = build()
    plan, verified, charged = _plan(model, inputs, strategy, k)
    real = measured_peak(copy.deepcopy(model), inputs, plan, accumulation=k, grad_sync=plan.grad_sync)
    assert {"token", "aux.weight", "blocks.5.spare.weight"} <= set(verified.unused_params)
    assert all(v >= 0 for v in verified.memory.values()), verified.memory  # the state taken off its own kind
    assert abs(verified.peak_bytes / real - 1) < 0.001, (verified.peak_bytes, real)
    assert abs(plan.predicted.peak_bytes / real - 1) < 0.001, (plan.predicted.peak_bytes, real)
    # charged a gradient and Adam state for them, as before, the prediction was over
    assert charged.predicted.peak_bytes > real * 1.01, (charged.predicted.peak_bytes, real)


def test_every_gloo_worker_allocates_what_was_verified(tmp_path):
    """4 real gloo workers as the trainer runs them (DDP learning of the unused parameters from
    the verified plan: `runtime.ddp.finds_unused`), each worker's peak against the verified one."""
    plans = [_plan(*build(), s, 1)[0] for s in ("full_shard", "replicate")]
    out, spec = tmp_path / "peaks.json", "python:" + str(Path(__file__).parent / "user_models.py:build_spare")
    launch(worst_worker, nproc=4, args=([(spec, plan.to_json()) for plan in plans], str(out)))
    for plan, workers in zip(plans, json.loads(out.read_text())):
        assert all(within(w, plan.verified.peak_bytes, plan, rel=0.01) for w in workers), (plan.verified, workers)
