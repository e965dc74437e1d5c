"""The table `shardsched train` ends with."""
from __future__ import annotations

from shardsched._fmt import console as default_console
from shardsched._fmt import UNITS, fmt_bytes, fmt_seconds, readable_note, runs, short_name, span_name


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
    unit = UNITS.get(summary.get("throughput_unit"), "tokens/s")
    table.add_row(unit, "n/a" if tps is None else f"{tps:,.0f}", "")
    table.add_row("peak memory per worker", fmt_bytes(summary["measured_peak_bytes"]),
                  fmt_bytes(summary["predicted_peak_bytes"]))
    if summary.get("usable_budget_bytes") is not None:
        given = summary.get("memory_budget_bytes")
        table.add_row("usable memory budget", "", f"{fmt_bytes(summary['usable_budget_bytes'])} ("
                      + (f"{fmt_bytes(given)}" if given else "device memory")
                      + f" less {fmt_bytes(summary.get('headroom_bytes') or 0)} headroom)")
    table.add_row("step time (median)", fmt_seconds(summary["measured_step_seconds"]),
                  fmt_seconds(summary["predicted_step_seconds"]))
    units = Table(title="units")
    units.add_column("unit")
    units.add_column("strategy")
    for name, strategy in folded_units(summary["units"]):
        units.add_row(name, strategy)
    console = default_console()
    console.print(table)
    console.print(units)
    for note in summary["notes"]:
        console.print(f"note: {readable_note(note)}")


def folded_units(units: list[dict]) -> list[tuple[str, str]]:
    """(name, strategy) rows, the strategy with its checkpointing ("full_shard+ckpt", as the
    plan prints it); 3 or more consecutive units of one strategy and size in one row."""
    label = lambda u: u["strategy"] + u.get("checkpoint", "")  # noqa: E731 - older summaries have none
    rows = []
    for a, b in runs(units, key=lambda u: (label(u), len(u["layers"]))):
        if b - a < 2:
            rows.extend((short_name(u["name"]), label(u)) for u in units[a:b + 1])
        else:
            rows.append((short_name(span_name(units[a]["name"], units[b]["name"])), f"{label(units[a])} x{b - a + 1}"))
    return rows
