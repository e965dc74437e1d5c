"""The trade-off figure: predicted step time against the per-worker budget.

One line per uniform configuration (drawn where it fits), the automatic plan's line
on top, and a marker wherever the automatic plan's mix changes (labelled with it).
matplotlib's Agg backend: no display needed.
"""
from __future__ import annotations

import math


def tradeoff_png(path: str, points, *, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardsched.tradeoff.sweep import mix_label

    gib = [p.budget / 2**30 for p in points]
    fig, ax = plt.subplots(figsize=(10, 6), dpi=100)
    for name in points[0].uniform:
        ys = [p.uniform[name].seconds if p.fits(name) else math.nan for p in points]
        if any(not math.isnan(y) for y in ys):
            ax.plot(gib, ys, marker=".", linewidth=1, alpha=0.7, label=name)
    auto = [p.auto.predicted.step_seconds if p.auto else math.nan for p in points]
    ax.plot(gib, auto, color="black", linewidth=2.5, label="auto")
    prev = None
    for x, y, p in zip(gib, auto, points):
        mix = mix_label(p.auto)
        if p.auto is not None and mix != prev:
            ax.plot([x], [y], marker="o", markersize=9, color="black", fillstyle="none")
            ax.annotate(mix, (x, y), textcoords="offset points", xytext=(4, 8), fontsize=7, rotation=20)
        prev = mix
    ax.set_xlabel("per-worker memory budget (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
