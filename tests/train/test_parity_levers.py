"""Hybrid sharding, full_shard/node and checkpointed units on 4 gloo workers as 2 nodes of 2
train exactly like one process on the global batch."""
import pytest
import torch

from shardsched.train.launcher import launch

from ._helpers import reference_run, tiny_config
from ._levers import lever_worker
from .test_parity import update_error


def test_levers_match_single_process(tmp_path):
    cfg = tiny_config(str(tmp_path / "runs"))
    threads = torch.get_num_threads()
    try:
        full_losses, _ = reference_run(cfg, chunks=1)
        _, same_params = reference_run(cfg, chunks=4)
    finally:
        torch.set_num_threads(threads)
    from shardsched.train.task import build_model
    init = build_model(cfg).state_dict()
    out = tmp_path / "results.pt"
    launch(lever_worker, nproc=4, args=(cfg, str(out)))
    results = torch.load(out, weights_only=False)
    assert set(results) == {"hybrid+ckpt", "node+ckpt"}
    assert full_losses[-1] < full_losses[0] - 0.5
    for label, (losses, params) in results.items():
        assert len(losses) == 20
        assert losses == pytest.approx(full_losses, rel=1e-5), label
        for name in same_params:
            assert update_error(name, params[name], same_params[name], init[name]) < 1e-5, (label, name)
