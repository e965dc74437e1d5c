"""One PNG of a training run (RUN_DIR/report.png): `shardsched report RUN_DIR` draws it
(`commands.report`), and `shardsched train` at the end of a run.

Four panels from the run directory's metrics.jsonl and summary.json (the
contract in docs/design.md): training and validation loss over steps; step
time, measured against the plan's prediction; tokens/s; and peak memory per
worker, measured against predicted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from shardsched._fmt import UNITS, fmt_bytes
from shardsched.errors import UsageError
from shardsched.report.plot import figure, save

REPORT_NAME = "report.png"
MiB = 2**20


def read_run(run_dir: str) -> tuple[list[dict], dict]:
    """(metrics rows, summary); UsageError naming what is missing."""
    path = Path(run_dir)
    metrics, summary = path / "metrics.jsonl", path / "summary.json"
    if not metrics.is_file():
        raise UsageError(f"{run_dir}: no metrics.jsonl; accepted: a run directory written by `shardsched train`")
    try:
        rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
        info = json.loads(summary.read_text()) if summary.is_file() else {}
    except ValueError as e:
        raise UsageError(f"{run_dir}: unreadable run files ({e})") from None
    if not rows:
        raise UsageError(f"{run_dir}: metrics.jsonl holds no steps yet")
    return rows, info


def write_report(run_dir: str, out: str | None = None) -> Path:
    return save(report_figure(run_dir), out or Path(run_dir) / REPORT_NAME)


def report_figure(run_dir: str):
    """The four panels of a run (not yet saved)."""
    rows, summary = read_run(run_dir)
    steps = [r["step"] for r in rows]
    fig, (loss, step_time, tokens, memory) = figure(
        2, 2, title=f"{summary.get('model', '?')}, workers: {summary.get('world', '?')}, run: {run_dir}")
    changes = plan_changes(run_dir)
    for ax in (loss, step_time, tokens):
        _mark_plan_changes(ax, changes)  # first: the panels' legends then name the mark
    _loss_panel(loss, rows, steps)
    step_time.plot(steps, [r["step_seconds"] * 1e3 for r in rows], lw=0.8, label="measured")
    _predicted_line(step_time, summary.get("predicted_step_seconds"), scale=1e3)
    step_time.set(title="step time", xlabel="step", ylabel="ms")
    step_time.legend()
    tokens.plot(steps, [r["tokens_per_s"] for r in rows], lw=0.8)
    unit = UNITS.get(summary.get("throughput_unit"), "tokens/s")
    tokens.set(title="throughput", xlabel="step", ylabel=unit)
    if changes:
        tokens.legend()
    _memory_panel(memory, summary)
    return fig


def plan_changes(run_dir: str) -> list[int]:
    """Steps at which a resume ran under another plan: a resume that changes plan.json
    keeps the old one as plan.before-step_NNNNNN.json (train/resume.py)."""
    steps = (re.fullmatch(r"plan\.before-step_(\d+)\.json", p.name) for p in Path(run_dir).iterdir())
    return sorted(int(m.group(1)) for m in steps if m)


def _mark_plan_changes(ax, steps: list[int]) -> None:
    for i, step in enumerate(steps):
        ax.axvline(step, color="tab:purple", ls=":", lw=1.2, label="plan changed (resume)" if i == 0 else None)


def _loss_panel(ax, rows: list[dict], steps: list[int]) -> None:
    ax.plot(steps, [r["loss"] for r in rows], lw=0.8, label="training")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set(title="loss", xlabel="step", ylabel="cross-entropy (nats)")
    ax.legend()


def _predicted_line(ax, value: float | None, *, scale: float) -> None:
    if value is not None:
        ax.axhline(value * scale, color="tab:red", ls="--", label="predicted")


def _memory_panel(ax, summary: dict) -> None:
    peaks = summary.get("measured_peak_bytes_per_worker") or []
    ranks = list(range(len(peaks)))
    ax.bar(ranks, [(p or 0) / MiB for p in peaks], label="measured")
    _predicted_line(ax, summary.get("predicted_peak_bytes"), scale=1 / MiB)
    budget = summary.get("memory_budget_bytes")
    if budget:
        ax.axhline(budget / MiB, color="tab:green", ls="-.", label=f"budget {fmt_bytes(budget)}")
    usable = summary.get("usable_budget_bytes")
    if budget and usable and usable != budget:  # what the plan was fitted to, less --headroom
        ax.axhline(usable / MiB, color="tab:olive", ls=":", label=f"usable {fmt_bytes(usable)}")
    ax.set(title="peak memory per worker", xlabel="worker", ylabel="MiB", xticks=ranks)
    top = max([(p or 0) / MiB for p in peaks] + [(summary.get(k) or 0) / MiB
                                                 for k in ("predicted_peak_bytes", "memory_budget_bytes")])
    ax.set_ylim(0, top * 1.3 or 1)  # room for the legend above the bars
    if not any(peaks):
        ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
    ax.legend(loc="upper right")
