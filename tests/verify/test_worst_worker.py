"""Issue 26, "every worker, every timing": ten hand-written and Hugging Face models, each
planned (named strategies and auto), verified on fake tensors, then run for real by 4 gloo
workers; every worker's measured peak is within 3% of the verified peak, and no auto plan's
worker is over its usable budget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsched.api import plan_model
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import parse_model_spec
from shardsched.profile.trace import trace_profile
from shardsched.solve.build import make_plan
from shardsched.train.launcher import launch
from shardsched.verify.engine import verify_plan

from .._gloo import lag_bytes, within
from . import user_models as um
from ._worst_worker import worst_worker

HERE = Path(__file__).parent
# (model, strategy, budget): every structure issue 26 names, each under a strategy that
# reaches it (DDP for the unused parameter, a sharded one for the scalar).
CASES = [
    ("user_models.py:build_clip", "full_shard", None),
    ("user_models.py:build_dino", "replicate", None),
    ("user_models.py:build_shared", "shard_grad_op", None),
    ("user_models.py:build_gnn", "full_shard+sac", None),
    ("user_models.py:build_lstm", "auto", "8MiB"),
    ("user_models.py:build_gru", "full_shard+ckpt", None),
    ("user_models.py:build_vit", "auto", "13MiB"),
    ("hf_models.py:build_clip", "shard_grad_op+sac", None),
    ("hf_models.py:build_dinov2_labels", "replicate", None),
    ("hf_models.py:build_wav2vec2", "auto", "3MiB"),
]
WORLD = 4


def _spec(name: str) -> str:
    return f"python:{HERE / name}"


@pytest.fixture(scope="module")
def planned():
    plans = {}
    for name, strategy, budget in CASES:
        model, inputs = parse_model_spec(_spec(name)).builder()
        plans[name] = plan_model(model, inputs, world=WORLD, strategy=strategy, memory_budget=budget, headroom="0")
    return plans


def test_every_plan_is_verified_and_predicted_near_it(planned):
    for name, plan in planned.items():
        assert plan.verified is not None, name
        assert plan.verified.peak_bytes > 0
        if plan.memory_budget_bytes is not None:  # auto: the verified peak fits, whatever was predicted
            assert plan.verified.peak_bytes <= plan.usable_budget_bytes, name


def test_every_worker_is_within_3_percent_of_the_verified_peak(planned, tmp_path):
    out = tmp_path / "peaks.json"
    cases = [(_spec(name), plan.to_json()) for name, plan in planned.items()]
    launch(worst_worker, nproc=WORLD, args=(cases, str(out)))
    peaks = dict(zip((spec for spec, _ in cases), json.loads(out.read_text())))
    rows = []
    for name, plan in planned.items():
        worst = max(peaks[_spec(name)])
        rows.append((name, plan.verified.peak_bytes, peaks[_spec(name)], worst / plan.verified.peak_bytes - 1))
    print("\n".join(f"{n:34s} verified {v:>10,} workers {w} worst {e:+.2%}" for n, v, w, e in rows))
    for name, verified, workers, err in rows:
        # Within 3%, or above by one collective's buffer: [Note: gloo's lagging buffers].
        plan = planned[name]
        assert all(within(w, verified, plan, rel=0.03) for w in workers), (name, verified, workers)
        if plan.memory_budget_bytes is not None:
            assert max(workers) <= plan.usable_budget_bytes + lag_bytes(plan), (name, workers)


def test_a_unit_whose_inputs_need_no_gradient_reshards_after_its_own_backward(tmp_path):
    """A two-tower model whose text tower starts with its token embedding, one unit per layer
    ([Note: a unit whose inputs need no gradient] in runtime/own_backward.py). FSDP2 held that
    embedding gathered, with its gradient, through the image tower's backward (full_shard /
    full_shard+ckpt verified 3.7% / 10.4% above the prediction); the trace's window for it stayed
    open as long; on gloo its reduce-scatter's copies came on top mid-backward (+8.5%, [Note:
    gloo's reduce-scatter copies] in runtime/gloo.py). Now the prediction is the verified peak,
    and every gloo worker is within 1.5% of it, with no lagging-buffer allowance."""
    model, inputs = um.build_two_tower()
    profile = trace_profile(model, inputs, name="two_tower", device=DEVICES["cpu"])
    cluster = Cluster(world=WORLD, gpus_per_node=WORLD, device=DEVICES["cpu"])
    plans = [make_plan(profile, cluster, strategy=s, fuse=False) for s in ("full_shard", "full_shard+ckpt")]
    verified = [verify_plan(model, inputs, plan).peak_bytes for plan in plans]
    for plan, v in zip(plans, verified):
        assert abs(plan.predicted.peak_bytes / v - 1) <= 0.005, (plan.units[1].strategy, plan.predicted.peak_bytes, v)
    out, spec = tmp_path / "peaks.json", _spec("user_models.py:build_two_tower")
    launch(worst_worker, nproc=WORLD, args=([(spec, plan.to_json()) for plan in plans], str(out)))
    for v, workers in zip(verified, json.loads(out.read_text())):
        assert all(abs(w / v - 1) <= 0.015 for w in workers), (v, workers)  # one worker once +0.95%
