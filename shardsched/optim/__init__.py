"""Optimizers and schedules for large-batch data parallelism: LARS, warmup + polynomial decay."""
from shardsched.optim.lars import LARS
from shardsched.optim.schedule import warmup_poly

__all__ = ["LARS", "warmup_poly"]
