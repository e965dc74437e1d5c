"""Joining a group that torchrun or SLURM started, instead of spawning."""
import json
import subprocess
import sys
import pytest

from shardsched.errors import UsageError
from shardsched.train.launcher import check_nproc, external_rendezvous, first_host, free_port, slurm_port

from ._helpers import TINY

STEP = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "node[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


def test_rendezvous_from_torchrun_and_slurm_environments():
    assert external_rendezvous({}) is None
    tr = external_rendezvous({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                              "MASTER_ADDR": "node0", "MASTER_PORT": "1234"})
    assert (tr.rank, tr.world, tr.local_rank, tr.local_world, tr.addr, tr.port) == (3, 8, 1, 4, "node0", 1234)
    # A SLURM step without MASTER_ADDR (SLURM never sets it): the first host, a port from the job and step.
    slurm = external_rendezvous(STEP)
    assert (slurm.rank, slurm.world, slurm.local_rank, slurm.local_world, slurm.addr) == (1, 4, 1, 2, "node07")
    assert slurm.port == slurm_port(STEP) == 20000 + 1234 * 31 % 20000
    assert external_rendezvous({**STEP, "SLURM_STEP_ID": "1"}).port != slurm.port  # another step, another port
    assert external_rendezvous({**STEP, "MASTER_ADDR": "head", "MASTER_PORT": "29400"}).addr == "head"
    assert external_rendezvous({**STEP, "SLURM_NTASKS_PER_NODE": "1"}).local_world == 1
    # An sbatch script outside srun is one process: it may spawn local workers.
    assert external_rendezvous({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1"}) is None
    with pytest.raises(UsageError, match="SLURM_PROCID"):
        external_rendezvous({**STEP, "SLURM_PROCID": "9"})


@pytest.mark.parametrize("nodelist, host", [
    ("vm", "vm"), ("node[01-03]", "node01"), ("node[01-03,07],gpu5", "node01"), ("gpu5,node[1-2]", "gpu5"),
    ("rack[2-3]-n[04-05]", "rack2-n04"), ("a[7,9]", "a7"), ("10.0.0.[5-6]", "10.0.0.5"),
])
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert first_host(nodelist) == host


def test_nproc_must_agree_with_the_launcher(monkeypatch):
    for k, v in STEP.items():
        monkeypatch.setenv(k, v)
    assert check_nproc(None) == 4 and check_nproc(4) == 4
    with pytest.raises(UsageError, match="--nproc 2 disagrees with SLURM, which started 4 workers"):
        check_nproc(2)


def _why(err: str) -> str:
    """A failed torchrun's stderr: the workers' own lines come first, torchrun's report last."""
    return err if len(err) < 5000 else f"{err[:3000]}\n[...]\n{err[-2000:]}"


def _torchrun(*args, cwd=None):
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_train_under_torchrun_joins_the_group(tmp_path):
    proc = _torchrun("--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "shardsched", "train",
                     "--steps", "3", "--model", TINY, "--seq", "16", "--run-dir", str(tmp_path))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, _why(err)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world"] == 2 and summary["steps"] == 3
    assert out.count("run directory:") == 1  # only rank 0 speaks


def test_torchrun_two_nodes_on_loopback(tmp_path):
    """--nnodes 2: two torchrun agents (node ranks 0 and 1) of one process each on 127.0.0.1."""
    port, run = str(free_port()), tmp_path / "run"
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port]
    cmd = ["-m", "shardsched", "train", "--steps", "3", "--model", TINY, "--seq", "16", "--batch", "4",
           "--run-dir", str(run), "--quiet"]
    nodes = [_torchrun(*common, "--node_rank", str(r), *cmd) for r in (0, 1)]
    results = [n.communicate(timeout=600) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], [_why(e) for _, e in results]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world"] == 2
    assert [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # One worker per node: the plan says so (it said 2 before LOCAL_WORLD_SIZE was read).
    assert json.loads((run / "plan.json").read_text())["gpus_per_node"] == 1
