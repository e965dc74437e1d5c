"""shardsched: per-layer sharding plans under a memory budget, run on FSDP2."""
__version__ = "0.1.0"
