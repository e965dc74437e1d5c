"""`shardsched train` under a real SLURM (single node, set up by .ci/slurm-setup.sh):
srun -n2 and an sbatch script make one job of world 2, one metrics line per step;
an --nproc that disagrees with the step is one line, exit 2. Not skipped: if
SLURM is not running, the fixture sets it up (as .ci/run does)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train._helpers import TINY

ROOT = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, "-m", "shardsched", "train", "--steps", "3", "--model", TINY, "--seq", "16",
         "--batch", "4", "--strategy", "full_shard", "--quiet"]


@pytest.fixture(scope="module")
def slurm():
    setup = subprocess.run(["bash", str(ROOT / ".ci" / "slurm-setup.sh")], capture_output=True, text=True,
                           timeout=300)
    assert setup.returncode == 0, setup.stderr
    return True


def _check_one_job_of_world_2(run: Path) -> None:
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # one job: each step once (two local jobs would interleave 1,1,2,2,...)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world"] == 2
    assert json.loads((run / "plan.json").read_text())["world"] == 2


def test_srun_two_tasks_make_one_job(slurm, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(["srun", "-N1", "-n2", "--chdir", str(ROOT), *TRAIN, "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_one_job_of_world_2(run)


def _finished(job: str, *, timeout: float = 600.0) -> tuple[str, str]:
    """(JobState, ExitCode) of a batch job once it left the queue. `sbatch --wait` polls with
    back-off (about 30 s after a 12 s job); `scontrol` is asked every half second instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return fields["JobState"], fields.get("ExitCode", "")
        time.sleep(0.5)
    raise AssertionError(f"job {job} still queued or running after {timeout} s")


def test_sbatch_script(slurm, tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1\n#SBATCH -n2\n"
                      f"srun {' '.join(TRAIN)} --run-dir {run}\n")
    proc = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "job.out"), "--chdir", str(ROOT), str(script)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    state = _finished(proc.stdout.strip().split(";")[0])
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert state == ("COMPLETED", "0:0"), (state, log[-3000:])
    _check_one_job_of_world_2(run)


def test_srun_with_a_disagreeing_nproc_is_refused(slurm, tmp_path):
    proc = subprocess.run(["srun", "-n1", *TRAIN, "--nproc", "2", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("shardsched")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "--nproc 2 disagrees with SLURM, which started 1 workers" in lines[0]
    assert not (tmp_path / "run").exists()
