"""Saved by 4 workers, resumed by 2 past a truncated checkpoint: the same losses."""
import json
import shutil

import pytest

from shardsched.cli import main
from shardsched.train.launcher import launch

from ._helpers import TINY, tiny_config, train_worker


def losses(run_dir) -> dict[int, float]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def test_resume_with_fewer_workers_continues_exactly(tmp_path, capsys):
    first = tmp_path / "first"
    launch(train_worker, nproc=4, args=(tiny_config(str(first), checkpoint_every=10),))
    done = sorted(p.name for p in (first / "checkpoints").iterdir())
    assert done == ["step_000010", "step_000020"]
    uninterrupted = losses(first)
    assert sorted(uninterrupted) == list(range(1, 21))

    # As if the run had died while writing step 20: one shard file is cut short.
    second = tmp_path / "second"
    shutil.copytree(first, second)
    shard = second / "checkpoints" / "step_000020" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    capsys.readouterr()
    assert main(["train", "--resume", str(second), "--nproc", "2", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "step_000020" in err and "truncated" in err

    resumed = losses(second)
    assert sorted(resumed) == list(range(1, 21))
    for step in range(11, 21):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5), step
    summary = json.loads((second / "summary.json").read_text())
    assert summary["start_step"] == 10 and summary["world"] == 2 and summary["model"] == TINY
    assert summary["first_loss"] == pytest.approx(uninterrupted[1], rel=1e-6)
    assert summary["last_loss"] == pytest.approx(uninterrupted[20], rel=1e-5)
    # The good checkpoint at step 10 is still there, and the new step 20 replaced the broken one.
    names = sorted(p.name for p in (second / "checkpoints").iterdir())
    assert names == ["step_000010", "step_000020", "step_000020.broken"]
