"""Joining a group that torchrun or SLURM started, instead of spawning."""
import json
import shutil
import subprocess
import sys

import pytest

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


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_train_under_torchrun_joins_the_group(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         "-m", "shardsched", "train", "--steps", "3", "--model", TINY, "--seq", "16",
         "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world"] == 2 and summary["steps"] == 3
    assert proc.stdout.count("run directory:") == 1  # only rank 0 speaks
