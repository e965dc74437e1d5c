"""Local workers fork from a server that imported torch once ([Note: workers forked from a
preloaded server]); each launch still hands them the parent's environment and standard
streams as they are at that launch, as spawned workers would get them."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shardsched.train.launcher import launch
from shardsched.train.start import start_method


def _report(ctx, out: str) -> None:
    mark = os.environ.get("SHARDSCHED_TEST_MARK", "")
    Path(out, f"{ctx.rank}.txt").write_text(f"{mark} {os.getppid()}")
    print(f"worker {ctx.rank} says {mark}", flush=True)
    print(f"worker {ctx.rank} errs {mark}", file=sys.stderr, flush=True)


def test_each_launch_hands_workers_its_environment_and_streams(tmp_path, monkeypatch, capfd):
    assert start_method() == "forkserver"  # this machine has no CUDA
    for mark in ("first", "second"):  # the second launch forks from the server the first started
        monkeypatch.setenv("SHARDSCHED_TEST_MARK", mark)
        launch(_report, nproc=2, args=(str(tmp_path),))
        seen = [(tmp_path / f"{r}.txt").read_text().split() for r in range(2)]
        assert [s[0] for s in seen] == [mark, mark]
        assert all(int(s[1]) != os.getpid() for s in seen)  # forked by the server, not by us
        out, err = capfd.readouterr()  # two writers: lines may interleave (PYTHONUNBUFFERED)
        assert sorted(re.findall(rf"worker \d says {mark}", out)) == [f"worker 0 says {mark}", f"worker 1 says {mark}"]
        assert sorted(re.findall(rf"worker \d errs {mark}", err)) == [f"worker 0 errs {mark}", f"worker 1 errs {mark}"]


def test_spawn_is_still_chosen_when_asked(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("SHARDSCHED_START_METHOD", "spawn")
    monkeypatch.setenv("SHARDSCHED_TEST_MARK", "spawned")
    assert start_method() == "spawn"
    launch(_report, nproc=2, args=(str(tmp_path),))
    seen = [(tmp_path / f"{r}.txt").read_text().split() for r in range(2)]
    assert [(s[0], int(s[1])) for s in seen] == [("spawned", os.getpid())] * 2
    assert "worker 1 says spawned" in capfd.readouterr().out


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_a_run_started_without_stdout_or_stderr_trains(closed, tmp_path):
    """`train >&-`: nothing is handed to the workers for the stream the parent lacks (its
    number may name another file by then), and the run ends as it would with spawn."""
    run = tmp_path / "run"
    cmd = (f"{shlex.quote(sys.executable)} -m shardsched train --model gpt:layers=2,hidden=32,heads=2,seq=16 "
           f"--seq 16 --batch 4 --steps 1 --quiet --run-dir {shlex.quote(str(run))} {closed}")
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
