"""The trade-off figure: predicted step time against the per-worker budget.

One line per uniform configuration (drawn where it fits), the automatic plan's line
on top, and a marker wherever the automatic plan's mix changes (labelled with it).
matplotlib's Agg backend: no display needed.
"""
from __future__ import annotations

import math


def tradeoff_png(path: str, points, *, title: str) -> None:
    import matplotlib.pyplot as plt
    fig = tradeoff_figure(points, title=title)
    fig.savefig(path, format="png", bbox_inches="tight")  # "tight": the legend right of the axes is kept
    plt.close(fig)


def tradeoff_figure(points, *, title: str):
    """The figure (not yet saved): one line per uniform configuration, the automatic plan
    on top, its mix changes marked; the legend outside the axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardsched.tradeoff.sweep import mix_label

    gib = [p.budget / 2**30 for p in points]
    fig, ax = plt.subplots(figsize=(12, 6), dpi=100)
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
    from shardsched.report.plot import wrapped
    ax.set_title(wrapped(title, 90))
    ax.grid(True, alpha=0.3)
    # Outside the axes, right of them: inside, the legend covered the flat uniform curves.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig
