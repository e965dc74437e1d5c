"""SIGINT / SIGTERM to the parent of a run with real workers: the workers stop
together within seconds, a final checkpoint is written when checkpoints are on,
one line is printed, the exit status is 130 / 143, no worker is left behind,
and the run can be resumed. Also: a worker that exits 0 early is named."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardsched.cli import main
from shardsched.train import checkpoint as ckpt

TINY = "gpt:layers=2,hidden=32,heads=2,seq=16"
ARGS = ["--model", TINY, "--seq", "16", "--batch", "4", "--strategy", "full_shard", "--nproc", "2", "--quiet"]


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                out[int(entry)] = (int(stat.rsplit(")", 1)[1].split()[1]), Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                continue
    return out


def _children(pid: int) -> list[int]:
    """The worker processes of pid: spawned by it, or forked by the fork server it started
    ([Note: workers forked from a preloaded server]); not multiprocessing's resource tracker."""
    procs = _processes()
    servers = {p for p, (parent, cmd) in procs.items() if parent == pid and b"forkserver" in cmd}
    return [p for p, (parent, cmd) in procs.items()
            if (parent == pid and b"spawn_main" in cmd) or parent in servers]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _start(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardsched", "train", *ARGS, "--run-dir", str(run), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(proc: subprocess.Popen, run: Path, n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while len(_rows(run)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the run did not start"
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code, checkpoints", [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)])
def test_signal_to_the_parent_stops_everything(sig, code, checkpoints, tmp_path, capsys):
    run = tmp_path / "run"
    proc = _start(run, "--steps", "100000", *(["--checkpoint-every", "7"] if checkpoints else []))
    _wait_for_steps(proc, run, 3)
    workers = _children(proc.pid)
    assert len([w for w in workers if _alive(w)]) >= 2
    t0 = time.monotonic()
    proc.send_signal(sig)
    while any(_alive(w) for w in workers) and time.monotonic() - t0 < 60:
        time.sleep(0.02)
    elapsed = time.monotonic() - t0  # the workers are gone (the parent may still be exiting)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert elapsed < 5, elapsed
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and f"interrupted by {sig.name}" in lines[0] and "Traceback" not in err, err
    assert not [w for w in workers if _alive(w)], "a worker outlived the parent"
    last = _rows(run)[-1]["step"]
    assert f"after step {last}" in lines[0]
    assert [r["step"] for r in _rows(run)] == list(range(1, last + 1))
    log = (run / "train.log").read_text()
    assert lines[0] in log  # the story survives the terminal
    assert f"train: stopped at step {last} of 100000 ({last} steps in" in log and "train: done" not in log
    assert not (run / ".lock").exists()
    if not checkpoints:
        assert not (run / "checkpoints").exists()
        return
    # The final checkpoint is the step the run stopped at, whole and usable.
    assert ckpt.find_checkpoint(run, log=pytest.fail).name == f"step_{last:06d}"
    assert main(["train", "--resume", str(run), "--steps", str(last + 2), "--nproc", "2", "--quiet"]) == 0
    assert [r["step"] for r in _rows(run)] == list(range(1, last + 3))


def test_signal_to_one_worker_stops_all_and_names_no_innocent(tmp_path):
    """Ctrl-C that reaches one worker only: all stop at one step boundary, exit 130."""
    run = tmp_path / "run"
    proc = _start(run, "--steps", "100000")
    _wait_for_steps(proc, run, 3)
    worker = sorted(w for w in _children(proc.pid) if _alive(w))[-1]
    os.kill(worker, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted by SIGINT" in err and "worker 0" not in err, err


def test_a_worker_that_exits_0_early_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_RANK", "1")
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_STEP", "2")
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_MODE", "exit0")
    rc = main(["train", *ARGS, "--steps", "50", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 1 and "worker 1 exited with status 0 before the run finished" in err, err
