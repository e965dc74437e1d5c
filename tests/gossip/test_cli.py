"""Bad input -> one line, exit 2; `gossip simulate` writes its CSV and PNG."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from shardsched.cli import main

TINY = "gpt:layers=2,hidden=32,heads=2,seq=16"


@pytest.mark.parametrize("argv,needle", [
    (["gossip", "simulate", "--workers", "8", "--segments", "0"], "--segments 0"),
    (["gossip", "simulate", "--workers", "8", "--tensors", "4", "--segments", "5"], "--segments 5"),
    (["gossip", "simulate", "--workers", "8", "--groups", "3"], "--groups 3 must divide"),
    (["gossip", "simulate", "--sync", "sgp,gossipy"], "unknown sync algorithm 'gossipy'"),
    (["gossip", "compare", "--nproc", "4", "--batch", "6"], "multiple of --nproc 4"),
    (["train", "--sync", "sgp", "--strategy", "full_shard"], "cannot be combined with --strategy full_shard"),
    (["train", "--sync", "nope"], "unknown sync algorithm 'nope'"),
    (["train", "--sync", "crossover", "--segments", "0", "--model", TINY], "--segments must be at least 1"),
    (["train", "--sync", "crossover", "--segments", "999", "--model", TINY], "--segments 999 must be between 1"),
    (["train", "--sync", "crossover", "--groups", "3", "--nproc", "4", "--model", TINY], "--groups 3 must divide"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    assert main([*argv, *(["--run-dir", str(tmp_path / "r")] if argv[0] == "train" else [])]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_gossip_with_sharding_plan_refused(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", TINY, "--world", "2", "--strategy", "full_shard", "--device", "cpu",
                 "--json"]) == 0
    plan.write_text(capsys.readouterr().out)
    assert main(["train", "--sync", "sgp", "--model", TINY, "--seq", "16", "--plan", str(plan),
                 "--run-dir", str(tmp_path / "r")]) == 2
    assert "shards parameters" in capsys.readouterr().err


def test_simulate_writes_csv_and_png(tmp_path, capsys):
    out_csv, out_png = tmp_path / "c.csv", tmp_path / "c.png"
    assert main(["gossip", "simulate", "--workers", "8", "--steps", "5", "--params", "64",
                 "--sync", "crossover,sgp,dpsgd,allreduce", "--csv", str(out_csv), "--png", str(out_png)]) == 0
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 4 * 5
    by_sync = {r["sync"]: r for r in rows if r["step"] == "5"}
    model_bytes = 64 * 8
    assert float(by_sync["sgp"]["bytes_per_worker_per_step"]) == (64 + 1) * 8  # model + push-sum weight
    assert float(by_sync["crossover"]["bytes_per_worker_per_step"]) == model_bytes
    assert float(by_sync["dpsgd"]["bytes_per_worker_per_step"]) == 2 * model_bytes
    assert float(by_sync["allreduce"]["bytes_per_worker_per_step"]) == 2 * 7 / 8 * model_bytes
    assert float(by_sync["allreduce"]["consensus_distance"]) < 1e-12
    assert float(by_sync["sgp"]["spectral_gap"]) == pytest.approx(1.0)  # 3 steps of the hypercube average exactly
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table: 80 columns, every number whole (none cut to "…").
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out, out
    sgp = next(line.split() for line in out.splitlines() if line.split()[:1] == ["sgp"])
    assert sgp[1] == "1.0000" and sgp[4:6] == ["520", "B"]  # (64 + 1) x 8 bytes, as in the CSV


def test_gossip_train_shows_progress(tmp_path):
    """`train --sync` prints the same progress lines as `train` (it used to run silently)."""
    r = subprocess.run([sys.executable, "-m", "shardsched", "train", "--sync", "sgp", "--nproc", "2", "--model", TINY,
                        "--seq", "16", "--batch", "4", "--steps", "4", "--log-every", "2",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"train: {TINY}, 2 workers, --sync sgp; steps 1-4")
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["2/4", "4/4"]
    assert any(ln.startswith("train: done, 4 steps in") for ln in lines)
