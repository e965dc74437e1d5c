"""Joining a group that torchrun or SLURM started, instead of spawning."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from shardsched.train.launcher import external_rendezvous, free_port

from ._helpers import TINY


def test_rendezvous_from_torchrun_and_slurm_environments():
    assert external_rendezvous({}) is None
    tr = external_rendezvous({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                              "MASTER_ADDR": "node0", "MASTER_PORT": "1234"})
    assert (tr.rank, tr.world, tr.local_rank, tr.addr, tr.port) == (3, 8, 1, "node0", 1234)
    slurm = external_rendezvous({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                                 "MASTER_ADDR": "node2"})
    assert (slurm.rank, slurm.world, slurm.local_rank, slurm.addr, slurm.port) == (5, 16, 1, "node2", 29500)
    # SLURM without MASTER_ADDR is not a rendezvous we can join.
    assert external_rendezvous({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None


def test_train_under_torchrun_joins_the_group(tmp_path):
    # The venv's bin (where pip put torchrun) on PATH, as an activated venv has it: CI runs
    # `.venv/bin/python -m pytest` without activating, so PATH alone would not find it.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    torchrun = shutil.which("torchrun", path=env["PATH"])
    assert torchrun, "torchrun is installed with torch, next to this Python"
    proc = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
         "-m", "shardsched", "train", "--steps", "3", "--model", TINY, "--seq", "16",
         "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world"] == 2 and summary["steps"] == 3
    assert proc.stdout.count("run directory:") == 1  # only rank 0 speaks
