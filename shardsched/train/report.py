"""The table `shardsched train` ends with."""
from __future__ import annotations

from shardsched._fmt import console as default_console
from shardsched._fmt import fmt_bytes, fmt_seconds


def print_summary(summary: dict) -> None:
    """The final table: losses, throughput, measured vs predicted, strategies."""
    from rich.table import Table
    table = Table(title=f"shardsched train: {summary['model']}, {summary['world']} workers, "
                        f"{summary['steps']} steps")
    for col in ("", "measured", "predicted"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("loss (first -> last)", f"{summary['first_loss']:.4f} -> {summary['last_loss']:.4f}", "")
    if summary.get("last_val_loss") is not None:
        table.add_row("validation loss (last)", f"{summary['last_val_loss']:.4f}", "")
    tps = summary["tokens_per_s"]
    table.add_row("tokens/s", "n/a" if tps is None else f"{tps:,.0f}", "")
    table.add_row("peak memory per worker", fmt_bytes(summary["measured_peak_bytes"]),
                  fmt_bytes(summary["predicted_peak_bytes"]))
    table.add_row("step time (median)", fmt_seconds(summary["measured_step_seconds"]),
                  fmt_seconds(summary["predicted_step_seconds"]))
    units = Table(title="units")
    units.add_column("unit")
    units.add_column("strategy")
    for u in summary["units"]:
        units.add_row(u["name"], u["strategy"])
    console = default_console()
    console.print(table)
    console.print(units)
    for note in summary["notes"]:
        console.print(f"note: {note}")
