"""The one place that sets up matplotlib, for every PNG shardsched writes.

`figure(rows, cols)` gives a headless (Agg) figure and its axes; `save(fig, path)`
writes it atomically and closes it. Other commands' PNGs (`plan --png`, gossip)
can reuse these two functions and keep their own layout.
"""
from __future__ import annotations

import os
from pathlib import Path


def figure(rows: int, cols: int, *, title: str, size: tuple[float, float] = (11.0, 7.5)):
    """(fig, axes as a flat list) on the Agg backend, which needs no display."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    fig.suptitle(wrapped(title, 110))
    return fig, [ax for row in axes for ax in row]


def wrapped(title: str, width: int = 72) -> str:
    """A title broken at spaces into lines of at most `width` characters: matplotlib
    never wraps, and a long one-line title is cut off at the figure's edge."""
    import textwrap
    return "\n".join(textwrap.wrap(title, width)) or title


def save(fig, path: str | os.PathLike) -> Path:
    """Write fig as PNG via a temporary file and rename; returns the path."""
    import matplotlib.pyplot as plt
    path = Path(path)
    tmp = path.with_name(f".{path.name}.part")
    fig.tight_layout()
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
