"""Per-replica checkpoints for gossip runs.

Gossip replicas differ, so a checkpoint holds every rank's own state:
RUN_DIR/checkpoints/step_000010/rank_<r>.pt (model, optimizer, push-sum weight
and OSGP inbox of rank r) plus meta.json and the COMPLETE manifest of
train/checkpoint.py, written by the same tmp-then-rename protocol, so
`find_checkpoint`/`verify` (sizes and sha256) work unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from shardsched.errors import UsageError
from shardsched.train import checkpoint as ckpt


def rank_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rank_{rank}.pt"


def save_replicas(run_dir: str | os.PathLike, *, step: int, state: dict, group: dist.ProcessGroup,
                  rank: int, meta: dict) -> Path:
    """Collective: every rank writes its own file; rank 0 seals the directory."""
    final = ckpt.checkpoint_dir(run_dir) / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier(group=group)
    torch.save({**state, "rng": torch.get_rng_state()}, rank_file(tmp, rank))
    dist.barrier(group=group)
    if rank == 0:
        (tmp / ckpt.META).write_text(json.dumps({"step": step, "layout": "gossip-replicas", **meta}))
        ckpt._write_json_atomic(tmp / ckpt.MARKER, {"step": step, "files": ckpt._manifest(tmp)})
        ckpt._publish(tmp, final)
    dist.barrier(group=group)
    return final


def load_replica(path: Path, *, rank: int, world: int) -> tuple[dict, dict]:
    """(this rank's state, meta.json); UsageError when the checkpoint is not a
    gossip checkpoint of `world` replicas."""
    meta = check_resumable(path, world=world)
    # weights_only: a run directory must never run code (a pickle may; tensors, dicts
    # and numbers are all a replica's state holds).
    state = torch.load(rank_file(path, rank), weights_only=True)
    torch.set_rng_state(state.pop("rng"))
    return state, meta


def check_resumable(path: Path, *, world: int) -> dict:
    """meta.json of a gossip checkpoint of `world` replicas; UsageError otherwise."""
    meta = ckpt.read_meta(path)
    if meta.get("layout") != "gossip-replicas":
        raise UsageError(f"checkpoint {path} is not a gossip checkpoint; resume it without --sync")
    if meta.get("world") != world:
        raise UsageError(f"checkpoint {path} holds {meta.get('world')} replicas; resume it with --nproc {meta.get('world')}")
    return meta
