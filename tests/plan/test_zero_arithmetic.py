"""Model states against the ZeRO paper's arithmetic (Rajbhandari et al. 2020, Fig. 1):
7.5B parameters, mixed-precision Adam, 64 workers: 120 GB replicated, 1.9 GB sharded."""
import pytest

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.build import make_plan
from shardsched.profile.types import LayerProfile, Profile


def seven_and_a_half_billion() -> Profile:
    layers = tuple(LayerProfile(name=f"blocks.{i}", params=75_000_000, forward_seconds=1e-3,
                                backward_seconds=2e-3, activation_bytes=0) for i in range(100))
    return Profile(model="7.5B", layers=layers, fingerprint="x")


@pytest.mark.parametrize("strategy,expected", [("replicate", 16 * 7.5e9), ("full_shard", 16 * 7.5e9 / 64),
                                               ("shard_grad_op", 16 * 7.5e9 / 64)])
def test_model_states_match_zero_paper(strategy, expected):
    plan = make_plan(seven_and_a_half_billion(), Cluster(world=64, gpus_per_node=8, device=DEVICES["v100"]),
                     strategy=strategy, precision="bf16-mixed", optimizer="adam")
    assert plan.predicted.model_states_bytes == pytest.approx(expected, rel=1e-9)


def test_paper_figures():
    p = seven_and_a_half_billion()
    cluster = Cluster(world=64, gpus_per_node=8, device=DEVICES["v100"])
    ddp = make_plan(p, cluster, strategy="replicate", precision="bf16-mixed").predicted.model_states_bytes
    fs = make_plan(p, cluster, strategy="full_shard", precision="bf16-mixed").predicted.model_states_bytes
    assert round(ddp / 1e9) == 120 and round(fs / 1e9, 1) == 1.9


def test_sgd_momentum_states_are_12_bytes_per_param():
    plan = make_plan(seven_and_a_half_billion(), Cluster(world=64, gpus_per_node=8, device=DEVICES["v100"]),
                     strategy="replicate", optimizer="sgd")
    assert plan.predicted.model_states_bytes == 12 * 7_500_000_000
