"""Issue 26, "every worker, every timing": ten hand-written and Hugging Face models, each
planned (named strategies and auto), verified on fake tensors, then run for real by 4 gloo
workers; every worker's measured peak is within 3% of the verified peak, and no auto plan's
worker is over its usable budget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsched.api import plan_model
from shardsched.models.spec import parse_model_spec
from shardsched.train.launcher import launch

from .._gloo import lag_bytes, within
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
    peaks = json.loads(out.read_text())
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
