"""bench/gpu_check.py, the one-command GPU check, run as the lead runs it (a fresh interpreter,
from the checkout) in its `--device cpu --quick` form: the same code path on a tiny Llama, gloo
for world 1 and the fake process group for worlds 8 and 64, FSDPMemTracker for memory. Keeps
the script from rotting between the rare runs on a GPU machine."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("full_shard", "full_shard+ckpt", "full_shard+sac")
# (world, micro-batch, seq, strategy) of every row the quick setup runs (`quick_setup`).
EXPECTED = ({(1, b, s, m) for b, s in ((1, 64), (2, 32)) for m in MODES}
            | {(w, 2, 32, m) for w in (8, 64) for m in MODES})
PEAK_TOLERANCE = 0.10  # measured here: 0.955 (world 1, gloo) .. 1.000 (fake groups) of the prediction


def run_quick(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(out), "--device", "cpu", "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_quick_run_measures_every_row_near_its_prediction(tmp_path):
    r = run_quick(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = doc["rows"]
    assert {(x["world"], x["micro_batch"], x["seq"], x["strategy"]) for x in rows} == EXPECTED
    assert len(rows) == len(EXPECTED)
    assert [x for x in rows if x["error"]] == []
    for x in rows:
        assert x["measured_allocated_bytes"] > 0 and x["predicted_peak_bytes"] > 0, x
        assert abs(x["allocated_ratio"] - 1) <= PEAK_TOLERANCE, x
        assert x["device"] == "cpu" and x["torch"] and x["units"] >= 1
    for x in (x for x in rows if x["world"] == 1):
        assert x["measured_step_seconds"] > 0 and x["step_ratio"] > 0 and x["step_ratio_calibrated"] > 0, x
    # checkpointing lowers the sharded peak, measured as predicted
    peak = {x["strategy"]: x["measured_allocated_bytes"] for x in rows if x["world"] == 8}
    assert peak["full_shard+ckpt"] < peak["full_shard+sac"] < peak["full_shard"], peak
    calibration = doc["calibration"]
    assert calibration["preset"] == "cpu" and calibration["calibrated_device"]["memory_bandwidth"] > 0
    assert all(v > 0 for v in calibration["calibrated_device"]["efficiency"].values())
    md = (tmp_path / "gpu_check.md").read_text()
    assert sum(line.startswith(("| 1 |", "| 8 |", "| 64 |")) for line in md.splitlines()) == len(EXPECTED)
    assert "12 rows, 0 errors" in r.stdout
