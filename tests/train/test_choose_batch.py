"""`train --global-batch N` without `--plan` chooses the micro-batch and grad-sync mode on the
path `plan --global-batch` takes (`solve.batch_choice.choose_batch`): the same plan, then trained."""
from __future__ import annotations

import dataclasses
import json

from shardsched.cli import main
from shardsched.train.config import TrainConfig
from shardsched.train.planning import make_local_plan
from shardsched.train.task import build, make_task
from shardsched.train.trainer import run_accumulation

MODEL = "gpt:layers=2,hidden=32,heads=2,seq=128"
SHAPE = ["--model", MODEL, "--seq", "128", "--global-batch", "16"]
BUDGET = "1.5MiB"
"""Below what 8 rows per worker need at once, so the search must accumulate."""


def test_train_plans_the_global_batch_as_plan_does(tmp_path, capsys):
    cfg = TrainConfig(model=MODEL, seq=128, batch=16, choose_batch=True, memory_budget_bytes=3 << 19,
                      run_dir=str(tmp_path / "r"))
    built = build(cfg, world=2)
    ours = make_local_plan(cfg, built, world=2)
    assert main(["plan", *SHAPE, "--world", "2", "--memory-budget", BUDGET, "--device", "cpu", "--json"]) == 0
    theirs = json.loads(capsys.readouterr().out)
    assert ours.accumulation > 1 and ours.micro_batch * ours.accumulation == 8
    assert (ours.micro_batch, ours.accumulation, ours.grad_sync.value) == \
        (theirs["micro_batch"], theirs["accumulation"], theirs["grad_sync"])
    assert [(u.name, u.strategy.value, u.checkpoint.value) for u in ours.units] == \
        [(u["name"], u["strategy"], u["checkpoint"]) for u in theirs["units"]]
    assert ours.predicted.peak_bytes == theirs["predicted"]["peak_bytes"] <= 3 << 19
    assert ours.notes[0] == theirs["notes"][0] and ours.notes[0].startswith("global batch 16: micro-batch")
    # The trainer runs what the plan chose.
    acc = run_accumulation(cfg, make_task(cfg, built, world=2), ours, world=2)
    assert (acc.micro_batch, acc.steps, acc.grad_sync) == (ours.micro_batch, ours.accumulation, ours.grad_sync)
    # --batch alone (no choice asked for) keeps one micro-batch of 8 rows.
    plain = make_local_plan(dataclasses.replace(cfg, choose_batch=False, memory_budget_bytes=4 << 20), built, world=2)
    assert (plain.micro_batch, plain.accumulation) == (8, 1)


def test_train_cli_trains_the_chosen_accumulation(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *SHAPE, "--memory-budget", BUDGET, "--nproc", "2", "--steps", "1", "--quiet",
                 "--run-dir", str(run)]) == 0
    plan = json.loads((run / "plan.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert plan["accumulation"] > 1
    assert (summary["micro_batch"], summary["accumulation"], summary["grad_sync"]) == \
        (plan["micro_batch"], plan["accumulation"], plan["grad_sync"])
    assert abs(summary["predicted_peak_bytes"] / summary["measured_peak_bytes"] - 1) < 0.03, summary
