"""A BatchNorm CNN under a checkpointed mixed plan on 2 gloo workers trains exactly like one
process, running statistics included: recomputation does not update them a second time
(runtime/parallelize.py, [Note: recomputation never changes module state])."""
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shardsched.train.launcher import launch
from shardsched.train.trainer import train

from ._helpers import make_plan_by_hand, reference_run, tiny_config

MODELS = Path(__file__).with_name("user_models.py")
CKPT = {"blocks.0", "blocks.1"}


def bn_worker(ctx, cfg, plan, out: str) -> None:
    torch.set_num_threads(1)
    res = train(cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
    state = get_model_state_dict(res.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ctx.rank == 0:
        torch.save((list(res.losses), state), out)


def test_checkpointed_batchnorm_matches_single_process(tmp_path):
    cfg = tiny_config(str(tmp_path / "run"), model=f"python:{MODELS}:bn_cnn", batch=8, lr=1e-2)
    threads = torch.get_num_threads()
    try:
        want_losses, want_state = reference_run(cfg)
    finally:
        torch.set_num_threads(threads)
    plan = make_plan_by_hand(cfg, world=2, units=[
        ("stem", ("stem",), "replicate", (), ()),
        ("blocks.0", ("blocks.0",), "full_shard", ("blocks.1",), ()),
        ("blocks.1", ("blocks.1",), "shard_grad_op", (), ("blocks.0",)),
        ("head", ("head",), "full_shard", (), ()),
    ])
    plan = dataclasses.replace(plan, units=tuple(dataclasses.replace(u, checkpoint=u.name in CKPT)
                                                 for u in plan.units))
    out = tmp_path / "result.pt"
    launch(bn_worker, nproc=2, args=(cfg, plan, str(out)))
    losses, state = torch.load(out, weights_only=False)
    assert want_losses[-1] < want_losses[0] - 0.2  # it learns: the comparison means something
    assert losses == pytest.approx(want_losses, rel=1e-5)
    stats = [k for k in want_state if "running_" in k]
    assert len(stats) == 10  # 5 BatchNorms, 2 of them in each checkpointed block
    for k in stats:
        torch.testing.assert_close(state[k], want_state[k], rtol=1e-5, atol=1e-6, msg=k)
    for k in (k for k in want_state if k.endswith("num_batches_tracked")):
        assert int(state[k]) == int(want_state[k]) == cfg.steps, k
