"""`shardsched train` end to end, and every bad input as one line with exit 2."""
import json
import subprocess
import sys

import pytest

from shardsched.cli import main
from shardsched.core.types import Plan

from ._helpers import TINY

SMALL = ["--model", TINY, "--seq", "16", "--batch", "4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    proc = subprocess.run([sys.executable, "-m", "shardsched", "train", "--steps", "3", "--nproc", "2",
                           "--run-dir", str(run_dir), "--eval-every", "2", *SMALL],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc


def test_run_directory_contract(run):
    run_dir, proc = run
    plan = Plan.from_json((run_dir / "plan.json").read_text())
    # No --strategy, no --memory-budget: planned automatically under the default budget.
    assert plan.world == 2 and plan.solver.name in ("highs", "greedy")
    assert plan.memory_budget_bytes is not None and plan.predicted.peak_bytes <= plan.memory_budget_bytes
    assert any("default memory budget" in n for n in plan.notes)
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["loss"] > 0 and r["tokens_per_s"] > 0 and r["step_seconds"] > 0
    assert "val_loss" in rows[1] and "val_loss" not in rows[0]
    assert 4.0 < rows[1]["val_loss"] < 7.0  # about ln(256) = 5.5 for a fresh byte model
    s = json.loads((run_dir / "summary.json").read_text())
    for key in ("first_loss", "last_loss", "steps", "measured_peak_bytes", "predicted_peak_bytes",
                "measured_step_seconds", "predicted_step_seconds"):
        assert s[key] is not None, key
    assert s["steps"] == 3 and s["first_loss"] == rows[0]["loss"] and s["last_loss"] == rows[-1]["loss"]
    assert s["predicted_peak_bytes"] == plan.predicted.peak_bytes > 0
    # The measured peak is the same order as the prediction (the cost model is checked elsewhere).
    assert 0.25 < s["measured_peak_bytes"] / s["predicted_peak_bytes"] < 4
    assert "peak memory per worker" in proc.stdout and "default memory budget" in proc.stdout


def _bad(argv, capsys):
    rc = main(["train", *argv])
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("argv, fragment", [
    (["--nproc", "0"], "--nproc must be at least 1"),
    (["--strategy", "bogus"], "unknown strategy 'bogus'"),
    (["--data", "/no/such/file.txt"], "no such file"),
    (["--memory-budget", "2XB"], "accepted: a byte count"),
    (["--batch", "3"], "multiple of the number of workers (2)"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--model", "nonsense"], "unknown model"),
])
def test_bad_input_is_one_line(argv, fragment, capsys):
    rc, err = _bad([*SMALL, *argv] if "--batch" not in argv else argv, capsys)
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_plan_for_another_model_or_world(run, capsys, tmp_path):
    plan = str(run[0] / "plan.json")
    rc, err = _bad([*SMALL, "--plan", plan, "--nproc", "4"], capsys)
    assert rc == 2 and "for 2 workers, this run has 4" in err
    rc, err = _bad(["--model", "gpt:layers=3,hidden=32,heads=2", "--seq", "16", "--plan", plan], capsys)
    assert rc == 2 and "another model" in err
    (tmp_path / "junk.json").write_text("{")
    rc, err = _bad([*SMALL, "--plan", str(tmp_path / "junk.json")], capsys)
    assert rc == 2 and "not valid JSON" in err


def test_tiny_data_file_names_the_size_needed(tmp_path, capsys):
    f = tmp_path / "tiny.txt"
    f.write_bytes(b"hello world")
    rc, err = _bad([*SMALL, "--data", str(f)], capsys)
    assert rc == 2 and "has 11 bytes; need at least 85" in err


def test_resume_without_a_checkpoint(tmp_path, capsys):
    rc, err = _bad([*SMALL, "--resume", str(tmp_path)], capsys)
    assert rc == 2 and f"no usable checkpoint in {tmp_path}" in err


def test_subprocess_bad_input_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shardsched", "train", "--data", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"shardsched train: error: --data {tmp_path / 'nope'}: no such file"]


def test_a_new_run_refuses_a_directory_with_checkpoints(tmp_path, capsys):
    (tmp_path / "checkpoints" / "step_000010").mkdir(parents=True)
    rc, err = _bad([*SMALL, "--run-dir", str(tmp_path)], capsys)
    assert rc == 2 and "already holds checkpoints" in err and f"--resume {tmp_path}" in err
