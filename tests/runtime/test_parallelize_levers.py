"""parallelize() with checkpointed units and node-aware strategies (world 1, gloo):
module paths unchanged, the forward recomputed in backward, whole nodes required."""
import dataclasses

import pytest
import torch

from shardsched.core.types import Plan, Strategy
from shardsched.errors import UsageError
from shardsched.profile.fingerprint import fingerprint
from shardsched.runtime.parallelize import parallelize
from shardsched.models.gpt import GPT

from tests.runtime.test_parallelize import CFG, mesh, unit  # noqa: F401  (mesh is a fixture)


def plan_of(model, *, ckpt: set[str], strategy=Strategy.FULL_SHARD, gpus_per_node=1) -> Plan:
    units = tuple(dataclasses.replace(unit(n, [n], strategy), checkpoint=n in ckpt)
                  for n in ("embed", "blocks.0", "blocks.1", "head"))
    return Plan(fingerprint=fingerprint(model), world=1, gpus_per_node=gpus_per_node, units=units)


def test_checkpointed_units_recompute_and_keep_their_paths(mesh):  # noqa: F811
    torch.manual_seed(0)
    model, ref = GPT(CFG), GPT(CFG)
    ref.load_state_dict(model.state_dict())
    names = [n for n, _ in model.named_parameters()]
    parallelize(model, plan_of(model, ckpt={"blocks.0"}), mesh=mesh)
    assert [n for n, _ in model.named_parameters()] == names  # DCP keys and plan paths unchanged
    calls = {"blocks.0.mlp": 0, "blocks.1.mlp": 0}
    for name in calls:
        model.get_submodule(name).register_forward_pre_hook(lambda m, a, name=name: calls.__setitem__(name, calls[name] + 1))
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    loss = model(x, y)
    loss.backward()
    assert calls == {"blocks.0.mlp": 2, "blocks.1.mlp": 1}  # recomputed only where planned
    ref_loss = ref(x, y)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-7)


def test_node_aware_plan_needs_whole_nodes(mesh):  # noqa: F811
    model = GPT(CFG)
    with pytest.raises(UsageError, match="does not divide the world 1"):
        parallelize(model, plan_of(model, ckpt=set(), strategy=Strategy.HYBRID_SHARD, gpus_per_node=2), mesh=mesh)
