"""Resume reuses the saved run (workers, plan, config) and says so; a DDP-replicate run's
checkpoint resumes into a sharded plan at another world size; progress lines and train.log
appear when stdout is not a terminal (pytest captures it)."""
import json

import pytest

from shardsched.cli import main

from ._helpers import TINY

BASE = ["train", "--model", TINY, "--seq", "16", "--batch", "8", "--seed", "3", "--eval-every", "4"]


def losses(run_dir) -> dict[int, float]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def test_resume_reuses_then_switches_engine_and_world(tmp_path, capfd):
    run = tmp_path / "rep"
    assert main(BASE + ["--strategy", "replicate", "--nproc", "2", "--steps", "8", "--checkpoint-every", "4",
                        "--log-every", "2", "--run-dir", str(run)]) == 0
    out = capfd.readouterr().out
    assert "on DDP" in out  # every unit replicate: DDP's engine, not FSDP2
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")] == ["2/8", "4/8", "6/8", "8/8"]
    log = (run / "train.log").read_text()
    assert "step 8/8" in log and "shardsched train" in log  # progress and the final table
    config = json.loads((run / "config.json").read_text())
    assert config["data_used"]["source"] == "python-stdlib" and config["data_used"]["train_bytes"] > 0
    full = losses(run)
    plan_before = (run / "plan.json").read_text()

    # No flags: the same 2 workers and the same plan; steps 5-8 again, the same losses.
    ckpt4 = str(run / "checkpoints" / "step_000004")
    assert main(["train", "--resume", ckpt4]) == 0
    out = capfd.readouterr().out
    reused = next(ln for ln in out.splitlines() if ln.startswith("resume: reusing"))
    assert "2 workers" in reused and "plan.json (replicate)" in reused and f"model={TINY}" in reused
    assert (run / "plan.json").read_text() == plan_before
    assert not list(run.glob("plan.before-*"))
    assert not (run / "checkpoints" / "step_000004" / "metrics.jsonl").exists()  # the run's own directory
    again = losses(run)
    for step in range(5, 9):
        assert again[step] == pytest.approx(full[step], rel=1e-5), step

    # Another world and a sharded plan, from the DDP checkpoint: the mathematics is unchanged.
    assert main(["train", "--resume", ckpt4, "--nproc", "1", "--strategy", "full_shard"]) == 0
    out = capfd.readouterr().out
    assert "on FSDP2" in out and "plan.json changed on resume" in out
    assert json.loads((run / "plan.json").read_text())["world"] == 1
    kept = json.loads((run / "plan.before-step_000004.json").read_text())
    assert {u["strategy"] for u in kept["units"]} == {"replicate"}
    sharded = losses(run)
    for step in range(5, 9):
        assert sharded[step] == pytest.approx(full[step], rel=1e-5), step
