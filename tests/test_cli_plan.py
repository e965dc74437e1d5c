"""`shardsched plan` end to end through the console entry point."""
import json
import subprocess
import sys
import time

import pytest

CONTRACT_KEYS = {"version", "fingerprint", "world", "gpus_per_node", "memory_budget_bytes", "units", "predicted", "solver"}
PREDICTED_KEYS = {"peak_bytes", "step_seconds", "compute_seconds", "exposed_comm_seconds", "lower_bound_seconds",
                  "model_states_bytes", "memory"}


def shardsched(*args, **kw):
    return subprocess.run([sys.executable, "-m", "shardsched", *args], capture_output=True, text=True, **kw)


def test_plan_json_has_the_contract_keys():
    r = shardsched("plan", "--model", "gpt:layers=24,hidden=2048,heads=16,vocab=50304,seq=2048", "--micro-batch", "4",
                   "--world", "64", "--strategy", "shard_grad_op", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert CONTRACT_KEYS <= plan.keys() and PREDICTED_KEYS <= plan["predicted"].keys()
    assert set(plan["predicted"]["memory"]) == {"params", "grads", "optimizer", "activations", "comm_buffers"}
    assert sum(u["params"] for u in plan["units"]) == 24 * 12 * 2048**2 + 24 * 13 * 2048 + 2 * 50304 * 2048 + 2048 * 2048 + 2 * 2048
    assert {u["strategy"] for u in plan["units"]} == {"shard_grad_op"}
    assert plan["predicted"]["memory"]["params"] + plan["predicted"]["memory"]["grads"] + \
        plan["predicted"]["memory"]["optimizer"] + plan["predicted"]["memory"]["activations"] + \
        plan["predicted"]["memory"]["comm_buffers"] == plan["predicted"]["peak_bytes"]


def test_gpt3_175b_at_world_1024_answers_in_under_2_seconds():
    t0 = time.perf_counter()
    # The planner's own time: verification (about 19 CPU s here, bench/bench_verify.py) is skipped.
    r = shardsched("plan", "--model", "gpt3-175b", "--world", "1024", "--gpus-per-node", "8", "--device", "h100",
                   "--strategy", "full_shard", "--no-verify")
    elapsed = time.perf_counter() - t0
    print(f"gpt3-175b plan at world 1024: {elapsed:.2f} s")
    assert r.returncode == 0, r.stderr
    assert "predicted peak per worker" in r.stdout and "blocks.1-95" in r.stdout and "full_shard x95" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80  # folded into one row, 80 columns
    assert elapsed < 2.0


def test_overrides_and_table(tmp_path):
    out = tmp_path / "p.json"
    r = shardsched("plan", "--model", "tiny", "--device", "cpu", "--world", "4", "--no-fuse",
                   "--strategy", "full_shard,blocks.0-1=replicate,head=shard_grad_op", "--out", str(out))
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    assert [u["strategy"] for u in plan["units"]] == ["full_shard", "replicate", "replicate", "full_shard",
                                                       "full_shard", "shard_grad_op"]
    assert "exposed communication" in r.stdout


BAD = [
    (["--model", "gpt5"], "unknown model"),
    (["--model", "gpt:layers=two"], "not an integer"),
    (["--model", "gpt:depth=3"], "accepted"),
    (["--memory-budget", "12XB"], "accepted"),
    (["--world", "0"], "--world must be >= 1"),
    (["--world", "12", "--gpus-per-node", "8"], "must divide"),
    (["--strategy", "zero4"], "unknown strategy"),
    (["--device", "tpu"], "unknown device"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = shardsched("plan", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_bad_plan_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    r = shardsched("plan", "--plan", str(bad))
    assert r.returncode == 2 and "not valid JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    good = tmp_path / "tiny.json"
    assert shardsched("plan", "--model", "tiny", "--device", "cpu", "--world", "2", "--out", str(good)).returncode == 0
    r = shardsched("plan", "--model", "small", "--device", "cpu", "--world", "2", "--plan", str(good))
    assert r.returncode == 2 and "another model" in r.stderr
    before = good.read_text()
    r = shardsched("plan", "--model", "tiny", "--world", "0", "--out", str(good))
    assert r.returncode == 2 and good.read_text() == before  # nothing good overwritten


def test_trace_shows_every_step_and_collective(tmp_path):
    trace = tmp_path / "t.json"
    r = shardsched("plan", "--model", "tiny", "--device", "cpu", "--world", "4", "--no-fuse", "--strategy", "full_shard",
                   "--trace", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    events = json.loads(trace.read_text())["traceEvents"]
    n = len(plan["units"])
    compute = [e for e in events if e.get("tid") == 0 and e["ph"] == "X"]
    comm = [e for e in events if e.get("tid") == 1 and e["ph"] == "X"]
    assert len(compute) == 2 * n + 1
    assert len(comm) == 2 * n + n  # full_shard: two AllGathers and one ReduceScatter per unit
    end = max(e["ts"] + e["dur"] for e in compute + comm) / 1e6
    assert end == pytest.approx(plan["predicted"]["step_seconds"], rel=1e-9)


def test_a_plan_over_budget_and_an_oversized_layer_are_reported():
    # --headroom 0: the h100's default headroom (5% + 1 GiB) would leave nothing of 200 MiB.
    r = shardsched("plan", "--model", "gpt2-xl", "--world", "8", "--strategy", "full_shard",
                   "--memory-budget", "200MiB", "--headroom", "0", "--json")
    assert r.returncode == 0
    assert "warning: predicted peak" in r.stderr and "exceeds the usable budget 200.00 MiB" in r.stderr  # fmt_bytes
    notes = json.loads(r.stdout)["notes"]
    # gpt2-xl's head: 1600 x 50257 parameters, bf16 gathered (2) + bf16 grads (2) + fp32 reduction (4)
    head = 1600 * 50257 + 1600 * 2
    assert any(n.startswith("head alone needs") and f"{head * 8} bytes" in n for n in notes)


USER_MODEL = '''
import torch, torch.nn as nn

class Net(nn.Sequential):
    def forward(self, x):
        return super().forward(x).pow(2).mean()  # model(x) is the scalar loss


def build():
    torch.manual_seed(0)
    model = Net(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    return model, (torch.randn(32, 64),)
'''


def test_python_model_is_traced_and_planned(tmp_path):
    (tmp_path / "usermodels.py").write_text(USER_MODEL)
    r = shardsched("plan", "--model", "python:usermodels:build", "--world", "8", "--no-fuse",
                   "--strategy", "full_shard,0=replicate", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [(u["layers"], u["strategy"], u["params"]) for u in plan["units"]] == [
        (["0"], "replicate", 64 * 256 + 256), (["2"], "full_shard", 256 * 256 + 256), (["4"], "full_shard", 256 * 8 + 8)]
    assert plan["device"] == "cpu" and plan["predicted"]["memory"]["activations"] > 0
    r = shardsched("plan", "--model", "python:usermodels:build", "--world", "8", "--memory-budget", "2MiB",
                   "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    auto = json.loads(r.stdout)
    assert auto["solver"]["name"] in ("highs", "greedy") and auto["predicted"]["peak_bytes"] <= 2 << 20
    r = shardsched("plan", "--model", "python:usermodels:nothing", cwd=tmp_path)
    assert r.returncode == 2 and "has no function 'nothing'" in r.stderr
