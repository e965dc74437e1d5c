"""Will the workers fit in this machine's memory? Checked before any starts.

On CPU every local worker lives in the same host memory, so a run needs about
world x (one worker's peak). A worker's peak is at least the unsharded fp32
model it builds before sharding (every worker initialises the full model, so
all start from the same weights) plus what the least-memory plan (full_shard
everywhere, no prefetch: `solve.auto.least_memory_peak`) holds at its peak.
That lower bound is compared with /proc/meminfo's MemAvailable: a run that
cannot fit ends with one line and exit 2 instead of the kernel's OOM killer
minutes later. GPU runs and runs under torchrun/SLURM are not checked (their
workers' memory is elsewhere or spread over nodes).
"""
from __future__ import annotations

from pathlib import Path

from shardsched._fmt import fmt_bytes
from shardsched.errors import UsageError


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes, or None where the kernel does not say (not Linux)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def predicted_worker_bytes(model: str, *, world: int, batch: int, seq: int, precision: str) -> int:
    """Lower bound of one CPU worker's peak: unsharded fp32 model + least-memory plan's peak."""
    from shardsched.core.types import Optimizer, Precision
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.profile.analytic import analytic_profile
    from shardsched.profile.resolve import compute_dtype
    from shardsched.solve.auto import least_memory_peak
    from shardsched.train.config import model_config
    prec = Precision(precision)
    profile = analytic_profile(model_config(model, seq=seq), micro_batch=max(1, batch // world), seq=seq,
                               device=DEVICES["cpu"], compute_dtype=compute_dtype(prec), name=model)
    cluster = Cluster(world=world, gpus_per_node=world, device=DEVICES["cpu"])
    return 4 * profile.params + least_memory_peak(profile, cluster, precision=prec, optimizer=Optimizer.ADAM)


def check_host_memory(model: str, *, world: int, batch: int, seq: int, precision: str,
                      available: int | None) -> None:
    """UsageError (one line) when world workers cannot fit in `available` bytes."""
    if available is None:
        return
    need = predicted_worker_bytes(model, world=world, batch=batch, seq=seq, precision=precision)
    if world * need > available:
        raise UsageError(
            f"--model {model} on {world} CPU workers needs at least {world} x {fmt_bytes(need)} = "
            f"{fmt_bytes(world * need)} of host memory (the unsharded model each worker builds plus the "
            f"least-memory plan's peak), but {fmt_bytes(available)} is available; a per-worker budget of "
            f"at most {fmt_bytes(available // world)} would fit: a smaller --model, --batch or --seq, or fewer --nproc")


def check_local_workers(cfg, *, world: int, external: bool) -> None:
    """The check for `shardsched train`'s own CPU workers (see the module docstring)."""
    import torch

    from shardsched.models.spec import parse_model_spec
    if external or torch.cuda.is_available() or parse_model_spec(cfg.model).config is None:
        return  # code and hf: models are checked against the budget once traced, not here
    check_host_memory(cfg.model, world=world, batch=cfg.batch, seq=cfg.seq, precision=cfg.precision,
                      available=mem_available())
