"""[Note: a parameter used outside its layer] in profile/escapes.py: a parameter the code reads
outside the module that owns it leaves its layer for the root unit, traced or measured; a layer
whose own code reads a child's parameter is never split into children; and a plan the engine
still cannot run is refused in one line."""
from __future__ import annotations

from shardsched.api import plan_model
from shardsched.cost.device import DEVICES
from shardsched.profile.measure import measure_profile
from shardsched.profile.trace import trace_profile
from shardsched.errors import UsageError

from tests.verify import user_models as um
from tests.verify.test_cli_verify import HERE, shardsched

import pytest


def _root_params(profile) -> int:
    return next(lay.params for lay in profile.layers if lay.name == "")


def test_a_hand_tied_embedding_goes_to_the_root_traced_and_measured():
    model, inputs = um.build_hand_tied()
    emb = model.emb.weight.numel()
    for profile in (trace_profile(model, inputs, name="hand_tied", device=DEVICES["cpu"]),
                    measure_profile(model, inputs, repeats=1, warmup=0)):
        names = [lay.name for lay in profile.layers]
        assert "emb" not in names and names[0] == "", (profile.source, names)
        assert _root_params(profile) == emb, profile.source
        assert sum(lay.params for lay in profile.layers) == sum(p.numel() for p in model.parameters())
        # each recurrence reads its `out` layer's weight in its own code: never split into children
        assert all(not lay.children for lay in profile.layers if lay.name.startswith("layers.")), profile.source


def test_a_hand_tied_embedding_plans_run_and_predict_their_peak():
    """Before, every sharded plan failed its first step ("aten.mm.default got mixed torch.Tensor
    and DTensor"), and `plan` ended in a traceback."""
    model, inputs = um.build_hand_tied()
    for strategy in ("full_shard", "full_shard+ckpt", "shard_grad_op"):
        plan = plan_model(model, inputs, world=4, strategy=strategy)
        assert plan.verified is not None, plan.notes
        assert abs(plan.predicted.peak_bytes / plan.verified.peak_bytes - 1) <= 0.03, (strategy, plan.predicted,
                                                                                       plan.verified)


def test_a_plan_the_engine_cannot_run_is_refused_in_one_line():
    with pytest.raises(UsageError, match="fails at its first step under the engine .* this code needs a plain"):
        plan_model(*um.build_engine_breaker(), world=4, strategy="full_shard")
    r = shardsched("plan", "--model", f"python:{HERE / 'user_models.py:build_engine_breaker'}", "--world", "4",
                   "--device", "cpu", "--strategy", "full_shard")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--no-verify" in r.stderr, r.stderr
