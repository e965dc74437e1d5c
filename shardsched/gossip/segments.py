"""Crossover's segments: contiguous slices of the flattened parameters.

Following Yeosangho/crossover-sgd (imagenet_test.py, `--chromosome coarse|fine`):
coarse cuts one segment per top-level child module, fine one per second-level
module (a block); an integer S cuts S contiguous runs of parameter tensors of
about equal size. A segment never splits a tensor.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import torch

from shardsched.errors import UsageError


def _bounds(counts: Sequence[int]) -> list[tuple[int, int]]:
    ends = list(itertools.accumulate(counts))
    return [(e - c, e) for c, e in zip(counts, ends)]


def split_sizes(sizes: Sequence[int], segments: int) -> list[int]:
    """Elements per segment when `sizes` (tensor numels, in order) are cut into
    `segments` contiguous runs whose totals are as close to equal as a greedy cut gets."""
    if segments < 1 or segments > len(sizes):
        raise UsageError(f"--segments {segments} must be between 1 and the model's {len(sizes)} parameter tensors")
    cum = [0, *itertools.accumulate(sizes)]
    cuts, prev = [0], 0
    for k in range(1, segments):
        target = cum[-1] * k / segments
        lo, hi = prev + 1, len(sizes) - (segments - k)
        prev = min(range(lo, hi + 1), key=lambda j: abs(cum[j] - target))
        cuts.append(prev)
    cuts.append(len(sizes))
    return [cum[b] - cum[a] for a, b in zip(cuts, cuts[1:])]


def _by_prefix(names: Sequence[str], sizes: Sequence[int], depth: int) -> list[int]:
    keys = [".".join(n.split(".")[:depth]) for n in names]
    return [sum(s for _, s in run) for _, run in itertools.groupby(zip(keys, sizes), key=lambda t: t[0])]


def segment_bounds(model: torch.nn.Module, segments: int | str) -> list[tuple[int, int]]:
    """(start, end) of every segment in the flattened parameter vector of `model`."""
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    names, sizes = [n for n, _ in named], [s for _, s in named]
    if segments == "coarse":
        return _bounds(_by_prefix(names, sizes, 1))
    if segments == "fine":
        return _bounds(_by_prefix(names, sizes, 2))
    return _bounds(split_sizes(sizes, int(segments)))


def equal_bounds(total: int, pieces: Sequence[int], segments: int) -> list[tuple[int, int]]:
    """Segment bounds for a flat vector made of tensors of sizes `pieces` (the simulator's problems)."""
    assert sum(pieces) == total
    return _bounds(split_sizes(pieces, segments))
