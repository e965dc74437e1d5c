"""examples/own_loop.py runs as documented: 2 gloo workers, a mixed automatic plan, and the
same losses as one process training on the whole batch without sharding."""
import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from shardsched.train.launcher import launch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_loop.py"


def load_example():
    # Imported by name (not from a file spec), so the spawned workers can unpickle
    # own_loop.worker: spawn hands the parent's sys.path to its children.
    if str(EXAMPLE.parent) not in sys.path:
        sys.path.insert(0, str(EXAMPLE.parent))
    return importlib.import_module("own_loop")


def reference(ex) -> list[float]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ex.GPT(ex.CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    losses = []
    for step in range(ex.STEPS):
        loss = model(*ex.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_own_loop_example_matches_one_process(tmp_path, capfd):
    ex = load_example()
    out = tmp_path / "losses.pt"
    launch(ex.worker, nproc=2, args=(str(out),))
    printed = capfd.readouterr().out
    options = set(re.search(r"units \((.*?)\)", printed).group(1).split(", "))
    assert len(options) >= 2, printed  # the budget forces a mixed plan (strategies or checkpointing)
    losses = torch.load(out)
    assert len(losses) == ex.STEPS and losses[-1] < losses[0] - 1.0
    assert losses == pytest.approx(reference(ex), rel=1e-5)
