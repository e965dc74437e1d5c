"""The micro-batch as a planning lever (`solve.batch`, `plan --global-batch`, `plan --max-batch`)."""
import json

import pytest

from shardsched.cli import main
from shardsched.core.types import GradSync
from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import PRESETS
from shardsched.profile.analytic import analytic_profile
from shardsched.solve.batch import divisors, max_micro_batch, plan_global_batch
from shardsched.solve.build import make_plan
from shardsched.runtime.accum import resolve

CLUSTER = Cluster(world=8, gpus_per_node=8, device=DEVICES["h100"])
KW = dict(precision="bf16-mixed", optimizer="adam")
BUDGET = 8 << 30


def profile_at(m: int):
    return analytic_profile(PRESETS["gpt2"], micro_batch=m, seq=1024, device=CLUSTER.device,
                            compute_dtype="bfloat16", name="gpt2")


def test_the_choice_is_the_fastest_fitting_of_every_micro_batch_and_mode():
    best, tried = plan_global_batch(profile_at, CLUSTER, global_batch=128, strategy="full_shard", budget=BUDGET, **KW)
    # brute force: every divisor of the 16 rows per worker, both modes, planned on its own
    found = []
    for m in divisors(16):
        for sync in GradSync:
            plan = make_plan(profile_at(m), CLUSTER, strategy="full_shard", memory_budget_bytes=BUDGET,
                             accumulation=(16 // m, sync), **KW)
            if plan.predicted.peak_bytes <= BUDGET:
                found.append((plan.predicted.step_seconds, m, sync))
    assert len(found) >= 4 and len(tried) == 2 * len(divisors(16)) - 1
    seconds, m, sync = min(found, key=lambda f: f[0])
    assert (best.micro_batch, best.accumulation, best.grad_sync) == (m, 16 // m, sync)
    assert best.predicted.step_seconds == seconds and best.predicted.peak_bytes <= BUDGET
    # micro-batch 1 is slower per global batch: the lever pays here
    one = min(f[0] for f in found if f[1] == 1)
    assert best.predicted.step_seconds < one


def test_max_micro_batch_is_the_largest_that_fits():
    budget = 6 << 30
    plan = max_micro_batch(profile_at, CLUSTER, strategy="full_shard", budget=budget, **KW)
    peaks = {m: make_plan(profile_at(m), CLUSTER, strategy="full_shard", memory_budget_bytes=budget,
                          **KW).predicted.peak_bytes for m in range(1, plan.micro_batch + 2)}
    assert all(peaks[m] <= budget for m in range(1, plan.micro_batch + 1))
    assert peaks[plan.micro_batch + 1] > budget and plan.micro_batch > 1


def test_plan_global_batch_json_and_train_honours_it(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "gpt2", "--world", "8", "--memory-budget", "8GiB", "--global-batch", "128",
            "--strategy", "full_shard", "--json", "--out", str(out)]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    again = json.loads(capsys.readouterr().out) if main(argv) == 0 else None
    for p in (plan, again):
        p["solver"].pop("seconds")  # wall time of the solve: the one field that may differ
    assert again == plan  # deterministic
    assert plan["micro_batch"] * plan["accumulation"] == 16 and plan["grad_sync"] in ("every", "last")
    from shardsched.plan.validate import read_plan_file
    acc = resolve(batch=128, world=8, micro_batch=None, grad_sync=None, plan=read_plan_file(str(out)))
    assert (acc.micro_batch, acc.steps, acc.grad_sync.value) == (plan["micro_batch"], plan["accumulation"],
                                                                  plan["grad_sync"])


@pytest.mark.parametrize("argv, words", [
    (["--global-batch", "100"], "--global-batch 100 is not a multiple of the 8 workers"),
    (["--global-batch", "64", "--micro-batch", "3"], "--micro-batch 3"),
    (["--grad-sync", "last"], "--grad-sync last needs --global-batch"),
])
def test_bad_batch_flags_are_one_line(capsys, argv, words):
    code = main(["plan", "--model", "gpt2", "--world", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_max_batch_table(capsys):
    argv = ["plan", "--model", "tiny", "--world", "4", "--device", "cpu", "--memory-budget", "64MiB", "--max-batch"]
    assert main([*argv, "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {r["strategy"]: r for r in table["rows"]}
    assert list(rows) == ["replicate", "shard_grad_op", "full_shard", "auto"]
    assert all(0 < r["peak_bytes"] <= 64 << 20 for r in rows.values())
    # more sharding, more room for rows; auto at least as much as any uniform strategy
    assert rows["replicate"]["max_micro_batch"] <= rows["full_shard"]["max_micro_batch"] \
        <= rows["auto"]["max_micro_batch"]
