"""Learning-rate schedules for large-batch training: linear warmup, then
polynomial decay (Goyal et al. 2017 for the warmup; You et al. 2017 use
poly(2) decay with LARS, as Yeosangho/crossover-sgd's `lrdecay poly`)."""
from __future__ import annotations


def warmup_poly(step: int, *, total: int, peak: float, warmup: int, power: float = 2.0, end: float = 0.0) -> float:
    """peak * (step+1)/warmup during warmup, then end + (peak-end) * (1 - progress)^power."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return end + (peak - end) * (1.0 - progress) ** power


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
