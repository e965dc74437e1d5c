"""`train --sync`: per-replica checkpoints; resume restores each rank's model, optimizer,
push-sum weight and in-flight OSGP message, so an interrupted run ends exactly where
an uninterrupted one does."""
from __future__ import annotations

import json
import shutil

import torch

from shardsched.cli import main

TINY = "gpt:layers=2,hidden=32,heads=2,seq=16"


def _train(run_dir, *extra):
    return main(["train", "--sync", "osgp", "--optimizer", "lars", "--lr", "0.5", "--nproc", "2", "--steps", "6",
                 "--checkpoint-every", "3", "--model", TINY, "--seq", "16", "--batch", "8", "--eval-every", "0",
                 "--quiet", "--run-dir", str(run_dir), *extra])


def test_resume_restores_every_replica(tmp_path, capsys):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert _train(full) == 0
    ckpt = full / "checkpoints" / "step_000003"
    assert sorted(p.name for p in ckpt.iterdir()) == ["COMPLETE", "meta.json", "rank_0.pt", "rank_1.pt"]
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, resumed / "checkpoints" / "step_000003")
    shutil.copy(full / "config.json", resumed / "config.json")
    assert main(["train", "--resume", str(resumed), "--nproc", "2", "--quiet"]) == 0  # --sync comes from config.json
    for rank in (0, 1):
        a = torch.load(full / "checkpoints" / "step_000006" / f"rank_{rank}.pt", weights_only=False)
        b = torch.load(resumed / "checkpoints" / "step_000006" / f"rank_{rank}.pt", weights_only=False)
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), k
        assert torch.equal(a["gossip"]["weight"], b["gossip"]["weight"])
        assert torch.equal(a["gossip"]["inbox"], b["gossip"]["inbox"])
        assert not torch.allclose(a["gossip"]["weight"], torch.ones(1, dtype=torch.float64))  # OSGP: w != 1
    # replicas really differ (a checkpoint of one replica would not do)
    r0 = torch.load(full / "checkpoints" / "step_000006" / "rank_0.pt", weights_only=False)["model"]
    r1 = torch.load(full / "checkpoints" / "step_000006" / "rank_1.pt", weights_only=False)["model"]
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)
    steps = [json.loads(ln)["step"] for ln in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 5, 6]
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["start_step"] == 3 and summary["sync"] == "osgp"
    # resuming with another number of workers is refused in the parent: one line, exit 2
    capsys.readouterr()
    assert main(["train", "--resume", str(full), "--nproc", "1", "--steps", "8", "--quiet"]) == 2
    assert "holds 2 replicas" in capsys.readouterr().err
