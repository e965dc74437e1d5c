"""`--strategy auto --memory-budget B` on real workers: B is chosen so that
replicate does not fit; the measured peak (FSDPMemTracker) stays within B and
the losses equal single-process training on the same global batch."""
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.auto import least_memory_peak
from shardsched.solve.build import make_plan
from shardsched.core.types import Optimizer, Precision, Strategy
from shardsched.profile.measure import measure_profile
from shardsched.train.launcher import launch
from shardsched.train.task import build_model

from ._helpers import auto_worker, reference_run, tiny_config, uniform_plan

MODEL = "gpt:layers=3,hidden=64,heads=2,seq=32"


def budget_between(cfg, world: int) -> tuple[int, int]:
    """(B, replicate's peak): B midway between the least-memory plan and replicate."""
    idx = torch.zeros(cfg.batch // world, cfg.seq, dtype=torch.long)
    profile = measure_profile(build_model(cfg), (idx, idx.clone()), name="t", repeats=1, warmup=0)
    cluster = Cluster(world=world, gpus_per_node=world, device=DEVICES["cpu"])
    least = least_memory_peak(profile, cluster, precision=Precision.FP32, optimizer=Optimizer.ADAM)
    rep = make_plan(profile, cluster, strategy="replicate").predicted.peak_bytes
    return (least + rep) // 2, rep


@pytest.mark.parametrize("world", [2, 4])
def test_auto_plan_keeps_measured_peak_within_budget(world, tmp_path):
    cfg = tiny_config(str(tmp_path / "run"), model=MODEL, seq=32, steps=8, measure_memory=True)
    budget, replicate_peak = budget_between(cfg, world)
    assert replicate_peak > budget  # replicate does not fit
    cfg = dataclasses.replace(cfg, strategy="auto", memory_budget_bytes=budget)
    threads = torch.get_num_threads()
    try:
        want, _ = reference_run(cfg)
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "out.pt"
    launch(auto_worker, nproc=world, args=(cfg, str(out)))
    losses, summary = torch.load(out, weights_only=False)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    strategies = {u["strategy"] for u in plan["units"]}
    print(f"world {world}: budget {budget} B, replicate needs {replicate_peak} B, predicted "
          f"{summary['predicted_peak_bytes']} B, measured {summary['measured_peak_bytes']} B, plan {strategies}")
    assert strategies != {Strategy.REPLICATE.value}
    assert plan["predicted"]["peak_bytes"] <= budget
    assert all(p is not None and p <= budget for p in summary["measured_peak_bytes_per_worker"])
    assert summary["memory_budget_bytes"] == budget and summary["budget_exceeded"] is False
    assert losses == pytest.approx(want, rel=1e-5)


def test_a_plan_over_its_budget_is_said_in_one_line_and_in_the_summary(tmp_path):
    """The promise is checked on every run: a plan whose measured peak exceeds the budget
    it was made for (here a full_shard plan given a budget of half its predicted peak)
    still trains, and `train` says so on stderr and in summary.json."""
    cfg = tiny_config(str(tmp_path), model=MODEL, seq=32)
    plan = uniform_plan(cfg, world=2, strategy="full_shard")
    forged = dataclasses.replace(plan, memory_budget_bytes=1 << 20)  # 1 MiB: far below any real peak
    path = tmp_path / "plan.json"
    path.write_text(forged.to_json())
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "shardsched", "train", "--model", MODEL, "--plan", str(path),
                        "--nproc", "2", "--steps", "2", "--seq", "32", "--batch", "8", "--run-dir", str(run_dir),
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["memory_budget_bytes"] == 1 << 20 and summary["budget_exceeded"] is True
    assert summary["measured_peak_bytes"] > 1 << 20
    lines = [ln for ln in r.stderr.splitlines() if "exceeds the plan's memory budget" in ln]
    assert len(lines) == 1 and "1.00 MiB" in lines[0], r.stderr
