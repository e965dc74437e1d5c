"""Every plan is verified (`shardsched.verify`); the prediction must stand on its own.

Two parts: the hand-written models whose misses were found at the root (issue 26's ViT of
nn.TransformerEncoderLayer, one layer object at two places, ...), each within 3% of its
verified peak; and a seed-fixed hypothesis sample of the generator's structures that
`plan_model` plans as users do (nn.LSTM/nn.GRU LMs, nn.TransformerEncoderLayer stacks,
boolean-mask losses, scatter message passing, shared layer objects, 0-dim and frozen
parameters, HF LMs trained through `labels=`): every case predicted within 3% of its verified
peak, and no auto plan's verified peak over its usable budget."""
from __future__ import annotations

import logging
import warnings

import pytest

from shardsched.errors import UsageError
from hypothesis import HealthCheck, Phase, example, given, settings

from shardsched.api import plan_model
from tests.plan._generated import EXTENDED, cases, draw_case, verified_case
from tests.verify import user_models as um

TOL = 0.03


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


@pytest.mark.parametrize("build,strategy", [
    # [Note: inputs passed twice] in profile/workspace.py: +9.7% / +9.7% / +0.4% before
    (um.build_vit, "full_shard"), (um.build_vit, "replicate"), (um.build_vit, "full_shard+sac"),
    (um.build_dino, "full_shard"),  # +4.5% before
    (um.build_dino, "replicate"),  # +3.2% before (a fused unit on DDP: sim.memory._backward)
    # [Note: boolean masks on fake tensors] in profile/trace_fake.py: +33% before (measured profile)
    (um.build_gnn, "full_shard+sac"), (um.build_gnn, "full_shard+ckpt"), (um.build_gnn, "replicate"),
    (um.build_shared, "replicate"),
    # [Note: frozen parameters] in sim/memory.py: +379% / +52% / +83% / +13% before
    (um.build_frozen, "replicate"), (um.build_frozen, "shard_grad_op"),
    (um.build_frozen, "replicate,head.*=full_shard"), (um.build_frozen, "full_shard"),
])
def test_user_model_predicted_as_verified(build, strategy):
    model, inputs = build()
    plan = plan_model(model, inputs, world=4, strategy=strategy, headroom="0")
    err = plan.predicted.peak_bytes / plan.verified.peak_bytes - 1
    assert abs(err) <= TOL, (strategy, err, plan.predicted.peak_at, plan.verified.peak_at)


def test_frozen_parameters_hold_no_gradient_and_no_adam_state():
    """ZeRO's model states in closed form: every parameter's 4 bytes, 4 + 8 more (gradient, Adam)
    for the 4,810 trainable ones only; the verified optimizer state is theirs too."""
    model, inputs = um.build_frozen()
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (total, trainable) == (136_970, 4_810)
    plan = plan_model(model, inputs, world=4, strategy="replicate", headroom="0")
    assert plan.predicted.model_states_bytes == 4 * total + 12 * trainable
    adam_steps = 4 * 4  # one 4-byte step counter per trained tensor (4 of them)
    assert plan.verified.memory["Optstate"] == 8 * trainable + adam_steps


@pytest.mark.parametrize("strategy", ["full_shard", "full_shard+ckpt"])
def test_layer_object_at_two_places_is_an_upper_bound(strategy):
    """[Note: a repeated layer between other layers] in profile/trace.py: the root holds the
    object called around other layers, each call's work the code after the layer before it;
    never under (a unit of its own was 22% under), +2.1% over now (+10.7% with every call's work
    folded into the layer before its first, +15% before that)."""
    model, inputs = um.build_shared()
    plan = plan_model(model, inputs, world=4, strategy=strategy, headroom="0")
    err = plan.predicted.peak_bytes / plan.verified.peak_bytes - 1
    assert 0 <= err <= 0.025, (strategy, err)


def test_an_encoder_reusing_a_layer_object_after_another_layer():
    """Generated case 1040 (`bench_verify.py --no-presets --cases 80 --seed 1000`): an encoder
    `[L0, L1, L0]` fused under auto at world 64 was +3.6% over its verified peak after the closed
    loop planned it again (L0's second call charged through L1's backward); each call's work is
    now the code after the layer before it: within 0.1%, planned once."""
    got = verified_case(*draw_case(1040, extended=True))
    assert abs(got["error"]) <= 0.001 and not got["replanned"], got


def test_a_layer_input_an_earlier_layers_policy_stores_is_kept_once():
    """Generated case 5069 (`bench_verify.py --no-presets --cases 120 --seed 5001`): a GNN whose
    input Linear's stored output is its message passing's input, fused under full_shard+sac, was
    +4.7% over its verified peak, that input counted by both layers ([Note: an input an earlier
    layer's policy stores] in plan/units.py); within 0.1% now."""
    got = verified_case(*draw_case(5069, extended=True))
    assert abs(got["error"]) <= 0.001, got


SAMPLE_TOL = TOL
"""The generated sample's bound, issue 26's 3%. 120 cases drawn from seeds 5001-5120
(`python bench/bench_verify.py --no-presets --cases 120 --seed 5001`, session 31): 119 within
3% (from -1.69% to +1.37%, median 0.00%), and one auto budget at the least-memory figure that no
verified plan meets (5082, refused in one line); 52 auto plans, none verified over its usable
budget, one corrected by the closed loop. Seed 5083 (-3.7% once: a masked, frozen GRU LM whose
0-dim scale and boolean mask the loss's backward runs through, [Note: the loss's backward
window] in profile/workspace.py) stays an explicit example. The promise itself, no auto plan
over its usable budget, is asserted exactly."""


@settings(max_examples=16, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(cases(extended=True).filter(lambda c: c[0].family in EXTENDED))
@example(draw_case(5083, extended=True))
def test_generated_plans_predicted_as_verified(case):
    spec, ps = case
    try:
        got = verified_case(spec, ps)
    except UsageError as e:
        # An auto budget at exactly the least-memory figure (budget factor 1.0) that a verified
        # peak a few bytes above its prediction cannot meet: one line, no plan over the budget.
        assert ps.strategy == "auto" and str(e).startswith("no plan this search could verify fits"), str(e)
        return
    assert got["measured"] is not None, got
    if got["budget"] is not None:
        assert got["measured"] <= got["budget"], got
    assert abs(got["error"]) <= SAMPLE_TOL, got
