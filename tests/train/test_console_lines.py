"""What `train` says on the console: the shape each worker trains on, a resume that
changes the learning-rate schedule, and a run that stops before its last step."""
import io
import json
import re
import subprocess
import sys

from shardsched.train.progress import Progress, ProgressMode
from shardsched.train.trainer import lr_at

from ._helpers import TINY

ARGS = ["--model", TINY, "--seq", "16", "--batch", "4", "--nproc", "2", "--strategy", "full_shard"]


def train(*args):
    return subprocess.run([sys.executable, "-m", "shardsched", "train", *ARGS, *args], capture_output=True,
                          text=True, timeout=300)


def test_shape_and_schedule_change_on_resume(tmp_path):
    run = str(tmp_path / "run")
    first = train("--steps", "4", "--checkpoint-every", "2", "--run-dir", run)
    assert first.returncode == 0, first.stderr
    # 4 rows over 2 workers, 16 tokens each; the plan was made for that shape, so no second shape
    assert re.search(r"2 workers, micro-batch 2 x seq 16, \d+ units? \(full_shard\) on FSDP2", first.stdout)
    assert "the plan assumed" not in first.stdout and "train: done, 4 steps" in first.stdout
    again = train("--steps", "8", "--resume", run)
    assert again.returncode == 0, again.stderr
    before, after = lr_at(3, steps=4, lr=3e-3, warmup=10), lr_at(4, steps=8, lr=3e-3, warmup=10)
    line = (f"note: the learning-rate schedule now spans 8 steps, not 4: at step 4 the rate goes from "
            f"{before:.1e} to {after:.1e} (pass --steps 4 to keep the schedule)")
    assert line in again.stdout, again.stdout
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[4]["step"] == 5 and rows[4]["lr"] == after != rows[3]["lr"]


def test_same_steps_on_resume_say_nothing_about_the_schedule(tmp_path):
    run = str(tmp_path / "run")
    assert train("--steps", "4", "--checkpoint-every", "2", "--run-dir", run).returncode == 0
    (tmp_path / "run" / "checkpoints" / "step_000004").rename(tmp_path / "run" / "later")  # resume from step 2
    again = train("--resume", run)
    assert again.returncode == 0, again.stderr
    assert "resuming from" in again.stdout and "(step 2)" in again.stdout
    assert "learning-rate schedule" not in again.stdout


def _closed(last: int, total: int) -> str:
    out = io.StringIO()
    p = Progress(mode=ProgressMode.QUIET, start=0, total=total, every=100, log=out)
    for step in range(1, last + 1):
        p.update(step, loss=1.0, tokens_per_s=10.0, step_seconds=0.01)
    p.close()
    return out.getvalue().splitlines()[-1]


def test_a_run_that_stops_early_says_where():
    assert re.fullmatch(r"train: stopped at step 65 of 300 \(65 steps in \d+\.\d s\)", _closed(65, 300))
    assert re.fullmatch(r"train: done, 300 steps in \d+\.\d s", _closed(300, 300))
