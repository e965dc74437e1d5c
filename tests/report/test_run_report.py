"""report.png of a run directory: the budget line on the memory panel, a mark where a
resume changed the plan, the throughput's unit (files written as `train` writes them)."""
import json

from shardsched.report.run import plan_changes, report_figure, write_report

MiB = 2**20


def _run_dir(tmp_path, *, unit="tok", budget=20 * MiB, resumed_at=(10,)):
    rows = [{"step": s, "loss": 5 - s / 10, "tokens_per_s": 1000.0, "step_seconds": 0.1} for s in range(1, 21)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"model": "tiny", "world": 2, "predicted_peak_bytes": 15 * MiB, "predicted_step_seconds": 0.08,
               "measured_peak_bytes_per_worker": [16 * MiB, 16 * MiB], "memory_budget_bytes": budget,
               "throughput_unit": unit}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "plan.json").write_text("{}")
    for step in resumed_at:
        (tmp_path / f"plan.before-step_{step:06d}.json").write_text("{}")
    (tmp_path / "config.before-step_000015.json").write_text("{}")  # a config change alone is no plan change
    return tmp_path


def test_budget_line_and_plan_change_marks(tmp_path):
    run = _run_dir(tmp_path, resumed_at=(10, 4))
    assert plan_changes(str(run)) == [4, 10]
    loss, step_time, tokens, memory = report_figure(str(run)).axes
    budget = [ln for ln in memory.get_lines() if ln.get_label() == "budget 20.00 MiB"]
    assert len(budget) == 1 and list(budget[0].get_ydata()) == [20.0, 20.0]
    assert memory.get_ylim()[1] >= 20.0
    for ax in (loss, step_time, tokens):
        marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert [ln.get_xdata()[0] for ln in marks] == [4, 10]
        assert "plan changed (resume)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert tokens.get_ylabel() == "tokens/s"
    assert write_report(str(run)).read_bytes()[:4] == b"\x89PNG"


def test_no_budget_no_line_and_images_per_second(tmp_path):
    run = _run_dir(tmp_path, unit="img", budget=None, resumed_at=())
    loss, step_time, tokens, memory = report_figure(str(run)).axes
    assert not [ln for ln in memory.get_lines() if ln.get_label().startswith("budget")]
    assert not [ln for ln in loss.get_lines() if ln.get_linestyle() == ":"]
    assert tokens.get_ylabel() == "images/s"
