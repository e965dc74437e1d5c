"""Measure the link alpha and bandwidth of this group with real collectives.

The alpha-beta model (`cost.comm`) prices an AllGather of M bytes over N
workers at (N-1) alpha + (N-1)/N * M / bw. Timing AllGathers of a small and a
large message on the group the run will use, and solving those two equations,
gives the link the planner should assume here (gloo over loopback on a laptop,
NCCL over NVLink on a node). All ranks must call it: it is collective.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from shardsched.cost.device import Link


def _all_gather(out: torch.Tensor, shard: torch.Tensor, *, group) -> None:
    # torch 2.13 renames all_gather_into_tensor to all_gather_single; keep both working.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, shard, group=group)


def _time_all_gather(nbytes: int, *, group, device: torch.device, repeats: int) -> float:
    world = dist.get_world_size(group)
    shard = torch.zeros(max(1, nbytes // 4 // world), dtype=torch.float32, device=device)
    out = torch.empty(shard.numel() * world, dtype=torch.float32, device=device)
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        _all_gather(out, shard, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first call sets up buffers and connections
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_link(*, group=None, device: torch.device | None = None, small: int = 1 << 12,
                 large: int = 1 << 23, repeats: int = 5) -> Link | None:
    """The (alpha, bandwidth) that reproduce this group's AllGather times; None at world 1."""
    world = dist.get_world_size(group)
    if world < 2:
        return None
    device = device or torch.device("cpu")
    t_small = _time_all_gather(small, group=group, device=device, repeats=repeats)
    t_large = _time_all_gather(large, group=group, device=device, repeats=repeats)
    steps, frac = world - 1, (world - 1) / world
    # t = steps * alpha + frac * M / bw, at two sizes; medians of noisy timings can
    # invert, so keep both parameters positive.
    per_byte = max((t_large - t_small) / (large - small), 1e-12)
    alpha = max((t_small - per_byte * small) / steps, 1e-7)
    # All ranks must agree on the plan's inputs: rank 0's measurement wins.
    both = torch.tensor([alpha, frac / per_byte], dtype=torch.float64, device=device)
    dist.broadcast(both, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return Link(alpha_seconds=float(both[0]), bandwidth=float(both[1]))
