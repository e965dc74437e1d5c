"""`shardsched tradeoff` and `shardsched plan --png` end to end; bad input of the new flags."""
import csv

import pytest
from matplotlib.image import imread

from shardsched.cli import main

TINY = ["--model", "tiny", "--device", "cpu", "--world", "4", "--gpus-per-node", "2"]


def test_tradeoff_writes_every_budget_and_a_png(tmp_path, capsys):
    out_csv, out_png = tmp_path / "t.csv", tmp_path / "t.png"
    assert main(["tradeoff", *TINY, "--budgets", "8MiB:20MiB:5", "--time-limit", "2",
                 "--csv", str(out_csv), "--png", str(out_png)]) == 0
    rows = list(csv.DictReader(out_csv.open()))
    assert [int(r["budget_bytes"]) for r in rows] == [8 << 20, 11 << 20, 14 << 20, 17 << 20, 20 << 20]
    # Composition columns: units of each option (the node-aware ones too) and how many are checkpointed.
    for key in ("n_hybrid_shard", "n_full_shard_node", "n_ckpt", "full_shard/node+ckpt_step_seconds"):
        assert key in rows[0]
    for r in rows:
        assert sum(int(r[k]) for k in r if k.startswith("n_") and k != "n_ckpt") == int(r["auto_units"])
        # Never slower than a uniform configuration that fits.
        fitting = [float(v) for k, v in r.items() if k.endswith("_step_seconds") and k != "auto_step_seconds" and v]
        assert all(float(r["auto_step_seconds"]) <= t * (1 + 1e-9) for t in fitting)
        assert int(r["auto_peak_bytes"]) <= int(r["budget_bytes"])
    img = imread(str(out_png))
    assert 560 <= img.shape[0] <= 600 and img.shape[1] > 1000  # 12 x 6 inches at 100 dpi, cropped to what is drawn
    out = capsys.readouterr().out
    assert "auto mix" in out and "best uniform" in out
    assert max(len(line) for line in out.splitlines()) <= 80  # the default table fits 80 columns
    assert main(["tradeoff", *TINY, "--budgets", "8MiB:20MiB:5", "--time-limit", "2", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "ZeRO-2+ck" in wide and "HSDP-Z2" in wide and max(len(line) for line in wide.splitlines()) > 80


def test_tradeoff_legend_is_outside_the_curves():
    from shardsched.core.types import Optimizer, Precision
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.models.spec import PRESETS
    from shardsched.profile.analytic import analytic_profile
    from shardsched.tradeoff.plot import tradeoff_figure
    from shardsched.tradeoff.sweep import sweep
    profile = analytic_profile(PRESETS["tiny"], micro_batch=1, seq=128, device=DEVICES["cpu"])
    points = sweep(profile, Cluster(world=4, gpus_per_node=2, device=DEVICES["cpu"]), [8 << 20, 20 << 20],
                   precision=Precision.FP32, optimizer=Optimizer.ADAM, time_limit=2)
    fig = tradeoff_figure(points, title="t")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 > axes.x1  # entirely right of the plotting area: it covers no curve


def test_plan_png_is_a_picture(tmp_path):
    out = tmp_path / "step.png"
    assert main(["plan", *TINY, "--memory-budget", "10MiB", "--png", str(out)]) == 0
    assert imread(str(out)).shape[:2] == (650, 1200)


@pytest.mark.parametrize("argv, words", [
    (["tradeoff", "--model", "tiny", "--device", "cpu", "--world", "4", "--gpus-per-node", "3"], "must divide"),
    (["plan", "--model", "tiny", "--device", "cpu", "--world", "4", "--gpus-per-node", "3"], "must divide"),
    (["tradeoff", *TINY, "--budgets", "20MiB:8MiB:5"], "empty or reversed"),
    (["tradeoff", *TINY, "--budgets", "8MiB:20MiB:0"], "empty or reversed"),
    (["tradeoff", *TINY, "--budgets", "8MiB:8MiB:4"], "empty or reversed"),
    (["tradeoff", *TINY, "--budgets", "8MiB:20MiB"], "LO:HI:N"),
    (["tradeoff", *TINY, "--png", "/nonexistent-dir/t.png"], "does not exist"),
    (["tradeoff", *TINY, "--csv", "/nonexistent-dir/t.csv"], "does not exist"),
    (["plan", *TINY, "--png", "/nonexistent-dir/step.png"], "does not exist"),
    (["train", "--nproc", "4", "--gpus-per-node", "3"], "must divide"),
])
def test_bad_input_is_one_line_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written
