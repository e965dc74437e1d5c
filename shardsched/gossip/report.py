"""`gossip simulate`: run every sync on one problem, add spectral gaps and predicted
communication times, print a table, write CSV and PNG."""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

from shardsched.cost.device import DEVICES
from shardsched.gossip.config import GossipConfig, Sync
from shardsched.gossip.cost import predicted_comm_seconds
from shardsched.gossip.simulate import SimResult, consensus_distance
from shardsched.gossip.topology import (allreduce_matrix, crossover_matrix, dpsgd_matrix, exponential_rounds,
                                        sgp_matrix, spectral_gap)

SPECTRAL_MAX_WORKERS = 1024
"""Eigenvalues of n x n matrices: beyond this the gap is left out (O(n^3))."""


@dataclass(frozen=True, kw_only=True)
class SyncRow:
    result: SimResult
    spectral_gap: float | None
    """1 - |lambda_2| per step of the mixing (None when not computed)."""
    comm_seconds_flat: float
    """Predicted communication per step, one worker per node (all on the inter-node link)."""
    comm_seconds_hier: float
    """Predicted communication per step, gpus_per_node workers per node."""


@functools.lru_cache(maxsize=16)
def mixing_gap(cfg: GossipConfig, world: int) -> float | None:
    """Spectral gap of `cfg`'s mixing on `world` ranks; cached, so `gossip simulate` computes it
    while the problem is being made (command.py) and `summarize` finds it."""
    if world > SPECTRAL_MAX_WORKERS:
        return None
    if cfg.sync is Sync.ALLREDUCE:
        return spectral_gap([allreduce_matrix(world)])
    if cfg.sync in (Sync.SGP, Sync.OSGP):
        return spectral_gap([sgp_matrix(world, k) for k in range(exponential_rounds(world))])
    if cfg.sync is Sync.DPSGD:
        return spectral_gap([dpsgd_matrix(world, cfg.topology)])
    return spectral_gap([crossover_matrix(world, cfg.group_count(world), seed=cfg.seed, step=k) for k in range(8)])


def summarize(result: SimResult, cfg: GossipConfig, *, nbytes: float, device: str, gpus_per_node: int,
              segments: int) -> SyncRow:
    n = result.weight.shape[0]  # not z: the command runs with models=False (z is (n, 0))
    kw = dict(world=n, nbytes=nbytes, device=DEVICES[device], segments=segments, topology=cfg.topology)
    return SyncRow(result=result, spectral_gap=mixing_gap(cfg, n),
                   comm_seconds_flat=predicted_comm_seconds(cfg.sync, gpus_per_node=1, **kw),
                   comm_seconds_hier=predicted_comm_seconds(cfg.sync, gpus_per_node=gpus_per_node, **kw))


def write_csv(rows: list[SyncRow], path: str) -> None:
    """One line per (sync, step): consensus, error and the per-sync constants."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sync", "step", "consensus_distance", "rel_error", "bytes_per_worker_per_step",
                    "spectral_gap", "predicted_comm_s_flat", "predicted_comm_s_hier"])
        for row in rows:
            r = row.result
            errs = r.rel_error or (None,) * len(r.consensus)
            for k, (c, e) in enumerate(zip(r.consensus, errs), start=1):
                w.writerow([r.sync.value, k, c, e, r.bytes_per_worker_per_step, row.spectral_gap,
                            row.comm_seconds_flat, row.comm_seconds_hier])


def write_png(rows: list[SyncRow], path: str, *, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        values = [max(c, 1e-16) for c in row.result.consensus]
        ax.semilogy(range(1, len(values) + 1), values, label=row.result.sync.value)
    ax.set_xlabel("step")
    ax.set_ylabel("consensus distance  mean ||x_i - x_bar||")
    from shardsched.report.plot import wrapped
    ax.set_title(wrapped(title, 64), fontsize=10)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


TABLE_COLUMNS = ("sync", "gap", "consensus", "rel. err", "bytes/step", "flat", "hier.", "sim s")
TABLE_LEGEND = ("gap: spectral gap; consensus, rel. err: last step; bytes/step: sent per worker; flat, hier.: "
                "predicted communication per step, flat ring or hierarchical; sim s: simulator seconds")


def table_row(row: SyncRow) -> tuple[str, ...]:
    """One sync algorithm's row: every number whole at 80 columns (3 significant digits
    for values spanning decades, fixed decimals otherwise)."""
    from shardsched._fmt import fmt_bytes
    r = row.result
    return (r.sync.value, "n/a" if row.spectral_gap is None else f"{row.spectral_gap:.4f}",
            f"{r.consensus[-1]:.2e}", f"{r.rel_error[-1]:.2e}" if r.rel_error else "n/a",
            fmt_bytes(r.bytes_per_worker_per_step), f"{row.comm_seconds_flat * 1e3:.3f} ms",
            f"{row.comm_seconds_hier * 1e3:.3f} ms", f"{r.seconds:.2f}")


def print_table(rows: list[SyncRow], *, title: str) -> None:
    from rich import box
    from rich.table import Table

    from shardsched._fmt import console
    paths = sorted({row.result.path.value for row in rows})
    table = Table(title=f"{title}; simulated {'/'.join(paths)}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="left" if col == "sync" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*table_row(row))
    out = console()
    out.print(table)
    out.print(TABLE_LEGEND, highlight=False, markup=False, style="dim")


__all__ = ["SyncRow", "consensus_distance", "print_table", "summarize", "write_csv", "write_png"]
