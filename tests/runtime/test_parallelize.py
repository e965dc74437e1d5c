"""parallelize() on a real (world 1, gloo) process group: partitioned and fused
units, refusal of foreign plans, and the schedule reaching FSDP2."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shardsched.errors import UsageError
from shardsched.core.types import Plan, Strategy, Unit
from shardsched.profile.fingerprint import fingerprint
from shardsched.runtime.parallelize import parallelize
from shardsched.models.gpt import GPT, GPTConfig

CFG = GPTConfig(vocab=64, layers=2, hidden=32, heads=2, seq=16)


@pytest.fixture(scope="module")
def mesh():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def unit(name, layers, strategy, fwd=(), bwd=()):
    model = GPT(CFG)
    params = sum(p.numel() for layer in layers for p in model.get_submodule(layer).parameters())
    return Unit(name=name, layers=tuple(layers), strategy=strategy, params=params,
                forward_prefetch=tuple(fwd), backward_prefetch=tuple(bwd))


def partitioned_plan(model) -> Plan:
    FS, SGO, REP = Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP, Strategy.REPLICATE
    units = (
        unit("embed..blocks.0.attn", ["embed", "blocks.0.ln1", "blocks.0.attn"], FS, fwd=["blocks.0.ln2"]),
        unit("blocks.0.ln2", ["blocks.0.ln2"], REP),
        # fused across a block boundary: children of two different parents
        unit("blocks.0.mlp..blocks.1.ln1", ["blocks.0.mlp", "blocks.1.ln1"], FS, bwd=["embed..blocks.0.attn"]),
        unit("blocks.1.attn", ["blocks.1.attn"], SGO),
        unit("blocks.1.ln2..head", ["blocks.1.ln2", "blocks.1.mlp", "head"], FS, bwd=["blocks.0.mlp..blocks.1.ln1"]),
    )
    return Plan(fingerprint=fingerprint(model), world=1, gpus_per_node=1, units=units)


def test_partitioned_and_fused_units_train_like_the_plain_model(mesh):
    torch.manual_seed(0)
    model, ref = GPT(CFG), GPT(CFG)
    ref.load_state_dict(model.state_dict())
    parallelize(model, partitioned_plan(model), mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randint(0, 64, (4, 16), generator=gen), torch.randint(0, 64, (4, 16), generator=gen)
        losses = []
        for m, o in ((model, opt), (ref, ref_opt)):
            loss = m(x, y)
            loss.backward()
            o.step()
            o.zero_grad()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(full[n], p, rtol=1e-5, atol=1e-7)


def test_schedule_reaches_fsdp2(mesh):
    model = GPT(CFG)
    plan = partitioned_plan(model)
    parallelize(model, plan, mesh=mesh)
    state = lambda path: model.get_submodule(path)._get_fsdp_state()  # noqa: E731
    assert state("embed")._states_to_forward_prefetch == [state("blocks.0.ln2")]
    # backward lists as planned; an empty one becomes [itself] so FSDP2's implicit prefetch stays off
    assert state("blocks.0.mlp")._states_to_backward_prefetch == [state("embed")]
    assert state("blocks.1.attn")._states_to_backward_prefetch == [state("blocks.1.attn")]


def test_foreign_plans_are_refused(mesh):
    model = GPT(CFG)
    plan = partitioned_plan(model)
    with pytest.raises(UsageError, match="another model"):
        parallelize(GPT(GPTConfig(vocab=64, layers=3, hidden=32, heads=2, seq=16)), plan, mesh=mesh)
    wrong_world = Plan(fingerprint=plan.fingerprint, world=4, gpus_per_node=4, units=plan.units)
    with pytest.raises(UsageError, match="made for 4 workers"):
        parallelize(model, wrong_world, mesh=mesh)
