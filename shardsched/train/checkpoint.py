"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout: RUN_DIR/checkpoints/step_000010/ holds DCP's files (one per worker plus
.metadata), meta.json (step, RNG state, config) and COMPLETE, a JSON list of
every other file with its size and sha256. A save writes into
step_000010.tmp and is renamed only after every worker finished and rank 0
wrote COMPLETE, so a run killed mid-save leaves a .tmp directory that resume
never looks at. On resume, the newest checkpoint whose files verify is used;
an interrupted, truncated or forged one (a COMPLETE that lists no files or
malformed entries, metadata naming classes DCP never writes, see `safe_dcp`) is
skipped with a message naming it and why.

DCP stores each DTensor by its global shape, so a checkpoint written by 4
workers loads into 2 (it reshards on load).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh

from shardsched._json import loads_strict
from shardsched.errors import UsageError
from shardsched.train.safe_dcp import (METADATA_FILE, SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpoint,
                                       read_metadata_file)

MARKER = "COMPLETE"
META = "meta.json"
_NAME = re.compile(r"^step_(\d{6,})$")


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(directory: Path) -> list[dict]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MARKER)
    return [{"file": str(p.relative_to(directory)), "size": p.stat().st_size, "sha256": _sha256(p)}
            for p in files]


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def save_checkpoint(run_dir: str | os.PathLike, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, mesh: DeviceMesh, rank: int,
                    meta: dict | None = None) -> Path:
    """Collective: every worker calls it. Returns the final directory."""
    group = mesh.get_group()
    final = checkpoint_dir(run_dir) / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a save that died; never a good checkpoint
        tmp.mkdir(parents=True)
    dist.barrier(group=group)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), process_group=group)
    dist.barrier(group=group)  # every worker's shard is on disk before the marker
    if rank == 0:
        info = {"step": step, "rng": torch.get_rng_state().tolist(), **(meta or {})}
        (tmp / META).write_text(json.dumps(info))
        _write_json_atomic(tmp / MARKER, {"step": step, "files": _manifest(tmp)})
        _publish(tmp, final)
    dist.barrier(group=group)
    return final


def _publish(tmp: Path, final: Path) -> None:
    """Rename tmp to final without ever destroying a good checkpoint at final."""
    if final.exists():
        if verify(final) is None:
            shutil.rmtree(tmp)  # the same step is already saved and intact
            return
        # A broken checkpoint under the final name: keep it aside for inspection.
        os.replace(final, final.with_name(final.name + ".broken"))
    os.replace(tmp, final)


def _manifest_entries(marker: Path, step: int | None) -> list[dict]:
    """COMPLETE's file list, checked for shape; ValueError saying what is wrong."""
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise ValueError("COMPLETE marker is unreadable") from e
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise ValueError("COMPLETE marker has no file list")
    if not files:
        raise ValueError("COMPLETE marker lists no files")
    if step is not None and data.get("step") != step:
        raise ValueError(f"COMPLETE marker is for step {data.get('step')!r}, not {step}")
    for i, e in enumerate(files):
        ok = (isinstance(e, dict) and isinstance(e.get("file"), str) and isinstance(e.get("size"), int)
              and isinstance(e.get("sha256"), str) and e["file"] and not Path(e["file"]).is_absolute()
              and ".." not in Path(e["file"]).parts)
        if not ok:
            raise ValueError(f"COMPLETE marker entry {i} is malformed")
    listed = {e["file"] for e in files}
    # DCP's .metadata, except in gossip checkpoints: one `rank_<r>.pt` per replica
    # (gossip/checkpoint.py), each loaded with weights_only.
    replicas = listed and all(f == META or (f.startswith("rank_") and f.endswith(".pt")) for f in listed)
    for needed in (META,) if replicas else (METADATA_FILE, META):
        if needed not in listed:
            raise ValueError(f"COMPLETE marker does not list {needed}")
    return files


def _step_of(path: Path) -> int | None:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def verify(path: Path) -> str | None:
    """None when the checkpoint at path is complete, intact and safe to read, else why not."""
    marker = path / MARKER
    if not marker.is_file():
        return "no COMPLETE marker (interrupted save)"
    try:
        files = _manifest_entries(marker, _step_of(path))
    except ValueError as e:
        return str(e)
    for entry in files:
        f = path / entry["file"]
        if not f.is_file():
            return f"{entry['file']} is missing"
        if f.stat().st_size != entry["size"]:
            return f"{entry['file']} has {f.stat().st_size} bytes, expected {entry['size']} (truncated)"
        if _sha256(f) != entry["sha256"]:
            return f"{entry['file']} fails its checksum"
    try:
        if METADATA_FILE in {e["file"] for e in files}:  # DCP's; gossip checkpoints have none
            read_metadata_file(path)
        _check_meta(read_meta(path))
    except (UnsafeCheckpoint, ValueError, OSError) as e:
        return str(e) or type(e).__name__
    return None


def _check_meta(meta) -> None:
    """meta.json as save_checkpoint writes it: a step and a CPU RNG state of bytes."""
    if not isinstance(meta, dict) or type(meta.get("step")) is not int or meta["step"] < 0:
        raise ValueError(f"{META} has no valid step")
    if meta.get("layout") == "gossip-replicas":
        return  # each replica's RNG state is in its own rank file
    rng = meta.get("rng")
    if not (isinstance(rng, list) and rng and all(type(b) is int and 0 <= b < 256 for b in rng)):
        raise ValueError(f"{META} has no valid RNG state")


def find_checkpoint(path: str | os.PathLike, *, log: Callable[[str], None] = print) -> Path:
    """The checkpoint to resume from: path itself if it is one, else the newest
    usable one under path/checkpoints. UsageError when there is none."""
    path = Path(path)
    if _NAME.match(path.name):
        why = verify(path)
        if why is None:
            return path
        raise UsageError(f"checkpoint {path} is not usable: {why}")
    candidates = sorted((p for p in checkpoint_dir(path).glob("step_*") if _NAME.match(p.name)),
                        key=lambda p: int(_NAME.match(p.name).group(1)), reverse=True)
    for cand in candidates:
        why = verify(cand)
        if why is None:
            return cand
        log(f"skipping checkpoint {cand}: {why}")
    raise UsageError(f"no usable checkpoint in {path}")


def read_meta(path: Path) -> dict:
    return loads_strict((path / META).read_bytes())


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    mesh: DeviceMesh) -> dict:
    """Collective: load model and optimizer state into the (already parallelized)
    model; returns meta.json's content (step, rng, ...)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    # Our reader and planner: nothing in the directory is unpickled beyond DCP's own
    # metadata classes and plain data (see safe_dcp).
    dcp.load(state, checkpoint_id=str(path), process_group=mesh.get_group(),
             storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = read_meta(path)
    torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    return meta
