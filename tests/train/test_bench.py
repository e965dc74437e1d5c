"""`shardsched bench`: every strategy on the same workers, ratios vs full_shard."""
import json
import subprocess
import sys

import pytest

from shardsched.cli import main
from shardsched.cost.bytes import parse_bytes

from ._helpers import TINY, mixed_plan, tiny_config


def test_bench_compares_strategies_and_a_plan(tmp_path):
    plan = tmp_path / "mixed.json"
    plan.write_text(mixed_plan(tiny_config(str(tmp_path)), world=2).to_json())
    # A fresh interpreter and `--json`: its stdout must be the rows and nothing else (issue 17).
    r = subprocess.run([sys.executable, "-m", "shardsched", "bench", "--nproc", "2", "--steps", "4", "--model", TINY,
                        "--seq", "16", "--batch", "4", "--plan", str(plan), "--run-dir", str(tmp_path / "bench"),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {row["variant"]: row for row in json.loads(r.stdout)}
    results = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert list(results) == ["replicate", "shard_grad_op", "full_shard", "plan"]
    for label, s in results.items():
        assert s["steps"] == 4 and s["measured_step_seconds"] > 0 and s["measured_peak_bytes"] > 0, label
    # Same data and init under every strategy: the same first loss.
    first = {s["first_loss"] for s in results.values()}
    assert max(first) - min(first) < 1e-5
    # Replicas hold all parameters, gradients and Adam state; full sharding half of them.
    assert results["replicate"]["measured_peak_bytes"] > results["full_shard"]["measured_peak_bytes"]
    assert [u["strategy"] for u in results["plan"]["units"]] == ["replicate", "shard_grad_op", "full_shard"]
    assert list(rows) == list(results) and rows["full_shard"]["step_ratio"] == 1.0
    assert rows["plan"]["peak_bytes"] == results["plan"]["measured_peak_bytes"]


@pytest.mark.parametrize("text, value", [
    ("4096", 4096), ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000),
    ("64 KiB", 65536), ("10kb", 10_000), ("7B", 7),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "2XB", "-1GiB", "0", "1.2.3MB"])
def test_parse_bytes_rejects(text):
    from shardsched.errors import UsageError
    with pytest.raises(UsageError, match="accepted: a byte count"):
        parse_bytes(text)
