"""Formatting shared by every table the command prints."""
from __future__ import annotations

import re
import sys
from typing import Callable, Hashable, Sequence, TypeVar

from rich.console import Console

T = TypeVar("T")
NARROW = 80
"""Columns of the tables by default, when stdout is not a terminal that says otherwise."""
WIDE = 200
"""Columns with --wide (every column and every unit)."""
UNITS = {"tok": "tokens/s", "img": "images/s", "rows": "rows/s", "batches": "batches/s"}
"""A run's `throughput_unit` as the console and the report label `tokens_per_s` (`train.task.Task.unit`)."""


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_bytes_short(n: float | None) -> str:
    """Three significant digits, at most 8 characters ("896 KiB", "1.23 GiB"): for tables at 80 columns."""
    if n is None:
        return "n/a"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def console(*, wide: bool = False) -> Console:
    """The terminal's width on a terminal, else 80 columns; 200 with --wide."""
    if wide:
        return Console(width=max(WIDE, Console().width))
    return Console() if sys.stdout.isatty() else Console(width=NARROW)


def runs(items: Sequence[T], key: Callable[[T], Hashable]) -> list[tuple[int, int]]:
    """(first, last) index of each maximal run of consecutive items with equal key."""
    return [(a, a + reps - 1) for a, period, reps in periodic_runs(items, key, max_period=1)]


def periodic_runs(items: Sequence[T], key: Callable[[T], Hashable], *,
                  max_period: int = 4, min_reps: int = 3) -> list[tuple[int, int, int]]:
    """Cover items with (start, period, repetitions): a pattern of `period` consecutive
    keys repeated `repetitions` times (alternating attention/MLP units fold with period 2).
    A pattern repeated fewer than min_reps times is left as single items (period 1)."""
    keys = [key(x) for x in items]
    out, i = [], 0
    while i < len(keys):
        best = (1, _reps(keys, i, 1))
        for p in range(2, max_period + 1):
            r = _reps(keys, i, p)
            if r >= min_reps and r * p > best[0] * best[1]:
                best = (p, r)
        p, r = best if best[1] >= min_reps or best[0] == 1 else (1, 1)
        r = r if r >= min_reps or p == 1 else 1
        out.append((i, p, r))
        i += p * r
    return out


def _reps(keys: list, i: int, p: int) -> int:
    r = 0
    while i + (r + 1) * p <= len(keys) and keys[i + r * p:i + (r + 1) * p] == keys[i:i + p]:
        r += 1
    return r


_TOKENS = re.compile(r"(\d+)")


def span_name(first: str, last: str) -> str:
    """The names of a run's first and last member with differing numbers as ranges:
    "blocks.0".."blocks.95" -> "blocks.0-95"; other pairs -> "first..last"."""
    if first == last:
        return first
    a, b = _TOKENS.split(first), _TOKENS.split(last)
    if len(a) != len(b) or any(x != y and not x.isdigit() for x, y in zip(a, b)):
        return f"{first}..{last}"
    return "".join(x if x == y else f"{x}-{y}" for x, y in zip(a, b))

def readable_note(note: str) -> str:
    """A plan note as printed: a note about the root unit starts with its name, "" (or
    "..last" when fused), which reads as nothing; print it "(root)"."""
    return f"(root){note}" if note.startswith((": ", "..")) else note


def short_name(name: str) -> str:
    """"blocks.0.ln1..blocks.0.attn" -> "blocks.0.ln1..attn": a fused unit's last layer
    without the prefix it shares with the first; the root unit (named "") is "(root)"."""
    if not name:
        return "(root)"
    first, sep, last = name.partition("..")
    if not sep:
        return name
    parent = first.rpartition(".")[0]
    if parent and last.startswith(parent + "."):
        return f"{first}..{last[len(parent) + 1:]}"
    return name
