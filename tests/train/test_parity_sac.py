"""Selective (op-level) activation checkpointing on 2 gloo workers trains exactly like one
process: a tiny GPT and a BatchNorm CNN under mixed plans with `+sac` units (and one `+ckpt`
unit beside them), losses, parameters and running statistics to 1e-5
(core/sac_policy.py, [Note: the selective checkpointing policy]; runtime/parallelize.py,
[Note: recomputation never changes module state])."""
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shardsched.core.types import Checkpoint
from shardsched.train.launcher import launch
from shardsched.train.trainer import train

from shardsched.train.task import build_model

from ._helpers import make_plan_by_hand, reference_run, tiny_config
from .test_parity import update_error

MODELS = Path(__file__).with_name("user_models.py")
SAC, FULL = Checkpoint.SELECTIVE, Checkpoint.FULL


def _with_modes(plan, modes: dict):
    return dataclasses.replace(plan, units=tuple(dataclasses.replace(u, checkpoint=modes.get(u.name, Checkpoint.NONE))
                                                 for u in plan.units))


def _cases(tmp_path) -> dict:
    gpt = tiny_config(str(tmp_path / "gpt"), steps=6)
    cnn = tiny_config(str(tmp_path / "cnn"), model=f"python:{MODELS}:bn_cnn", batch=8, lr=1e-2, steps=6)
    gpt_plan = _with_modes(make_plan_by_hand(gpt, world=2, units=[
        ("embed", ("embed",), "replicate", ("blocks.0",), ()),
        ("blocks.0", ("blocks.0",), "shard_grad_op", ("blocks.1+",), ("embed",)),
        ("blocks.1+", ("blocks.1", "head"), "full_shard", (), ("blocks.0",)),
    ]), {"blocks.0": SAC, "blocks.1+": SAC})
    cnn_plan = _with_modes(make_plan_by_hand(cnn, world=2, units=[
        ("stem", ("stem",), "replicate", (), ()),
        ("blocks.0", ("blocks.0",), "full_shard", ("blocks.1",), ()),
        ("blocks.1", ("blocks.1",), "shard_grad_op", (), ("blocks.0",)),
        ("head", ("head",), "full_shard", (), ()),
    ]), {"stem": SAC, "blocks.0": SAC, "blocks.1": FULL})
    return {"gpt": (gpt, gpt_plan), "cnn": (cnn, cnn_plan)}


def sac_worker(ctx, cases: dict, out: str) -> None:
    torch.set_num_threads(1)
    results = {}
    for label, (cfg, plan) in cases.items():
        res = train(cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
        results[label] = (list(res.losses), get_model_state_dict(
            res.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    if ctx.rank == 0:
        torch.save(results, out)


def test_selective_checkpointing_matches_single_process(tmp_path):
    cases = _cases(tmp_path)
    threads = torch.get_num_threads()
    try:
        # the GPT against one process averaging the 2 workers' row-chunk gradients (the workers'
        # arithmetic); the CNN against the whole batch, as tests/train/test_parity_batchnorm.py
        want = {label: reference_run(cfg, chunks=2 if label == "gpt" else 1) for label, (cfg, _) in cases.items()}
        init = {label: build_model(cfg).state_dict() for label, (cfg, _) in cases.items()}
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "result.pt"
    launch(sac_worker, nproc=2, args=(cases, str(out)))
    got = torch.load(out, weights_only=False)
    for label in cases:
        (losses, state), (want_losses, want_state) = got[label], want[label]
        assert want_losses[-1] < want_losses[0]  # it learns: the comparison means something
        assert losses == pytest.approx(want_losses, rel=1e-5), label
        assert set(state) == set(want_state)
        for k in want_state:
            if k.endswith("num_batches_tracked"):  # recomputation did not count a second pass
                assert int(state[k]) == int(want_state[k]) == cases[label][0].steps, k
            elif k.endswith(("running_mean", "running_var")):  # updated once per step, not twice
                torch.testing.assert_close(state[k], want_state[k], rtol=1e-5, atol=1e-6, msg=f"{label} {k}")
            else:  # as tests/train/test_parity.py: the parameter updates to 1e-5
                assert update_error(k, state[k], want_state[k], init[label][k]) < 1e-5, (label, k)
