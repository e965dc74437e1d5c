"""Start workers, or join the ones a cluster launcher started.

`launch(fn, nproc=..., args=...)` runs `fn(ctx, *args)` on every worker, where
`ctx` is a `WorkerContext` holding the rank, world and a 1-D DeviceMesh.

- Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK) or SLURM (SLURM_PROCID /
  SLURM_NTASKS / SLURM_LOCALID plus MASTER_ADDR) this process is one worker: it
  joins the existing group and runs `fn` itself.
- Otherwise it spawns `nproc` local workers on 127.0.0.1 and a free port.

gloo on CPU, NCCL (device cuda:LOCAL_RANK) when CUDA is present. A worker that
fails stops the whole run: the parent terminates the others and raises
`WorkerFailed` naming the rank; the process group's timeout bounds any wait
for a peer that is gone, so nothing hangs.
"""
from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from shardsched.errors import UsageError

DEFAULT_TIMEOUT_SECONDS = 180.0
"""Collective timeout: a peer that died mid-step ends the wait after this long."""


class WorkerFailed(RuntimeError):
    """A worker raised or was killed; the message names its rank."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True, kw_only=True)
class WorkerContext:
    """What a worker function gets: who it is and the mesh over all workers."""

    rank: int
    """Global rank of this worker."""
    world: int
    """Number of workers."""
    local_rank: int
    """Rank within this node (selects the GPU)."""
    device: torch.device
    """cpu, or cuda:local_rank."""
    mesh: DeviceMesh
    """1-D mesh over all workers; pass it on, never look it up globally."""


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where and as whom this process joins the group."""

    rank: int
    """Global rank (for the local spawn: the parent's placeholder 0)."""
    world: int
    """Number of workers."""
    local_rank: int
    """Rank within the node."""
    addr: str
    """MASTER_ADDR of the TCP store."""
    port: int
    """MASTER_PORT of the TCP store."""


def external_rendezvous(env: dict[str, str] | None = None) -> Rendezvous | None:
    """The rendezvous set up by torchrun or SLURM, or None when run stand-alone."""
    env = os.environ if env is None else env
    port = int(env.get("MASTER_PORT", "29500"))
    if "RANK" in env and "WORLD_SIZE" in env:
        return Rendezvous(rank=int(env["RANK"]), world=int(env["WORLD_SIZE"]),
                          local_rank=int(env.get("LOCAL_RANK", "0")),
                          addr=env.get("MASTER_ADDR", "127.0.0.1"), port=port)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env:
        return Rendezvous(rank=int(env["SLURM_PROCID"]), world=int(env["SLURM_NTASKS"]),
                          local_rank=int(env.get("SLURM_LOCALID", "0")),
                          addr=env["MASTER_ADDR"], port=port)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Any], *, nproc: int, args: tuple = (),
           timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """Run fn(ctx, *args) on every worker; raise WorkerFailed if any worker fails."""
    rdzv = external_rendezvous()
    if rdzv is not None:
        _worker_main(rdzv.local_rank, fn, args, rdzv, timeout_seconds)
        return
    rdzv = Rendezvous(rank=0, world=nproc, local_rank=0, addr="127.0.0.1", port=free_port())
    # torch logs one warning per worker it terminates; our own message names the culprit.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        # join=True: the first worker to exit non-zero makes spawn terminate the rest.
        mp.start_processes(_worker_main, args=(fn, args, rdzv, timeout_seconds),
                           nprocs=nproc, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        raise WorkerFailed(e.error_index, _exit_message(e.error_index, e.exit_code, e.signal_name)) from None
    except mp.ProcessRaisedException as e:
        last = _last_line(str(e))
        if last.startswith(_USAGE_PREFIX):
            raise UsageError(last[len(_USAGE_PREFIX):]) from None  # bad input found inside a worker
        raise WorkerFailed(e.error_index, f"worker {e.error_index} failed: {last}") from None


_USAGE_PREFIX = f"{UsageError.__module__}.{UsageError.__qualname__}: "


def _exit_message(rank: int, code: int | None, signal_name: str | None) -> str:
    if signal_name:
        return f"worker {rank} was killed by {signal_name}"
    return f"worker {rank} exited with status {code}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


def _device_and_backend(local_rank: int) -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device, "nccl"
    # Workers share the cores; one thread each avoids oversubscription.
    torch.set_num_threads(1)
    return torch.device("cpu"), "gloo"


def _worker_main(local_index: int, fn: Callable[..., Any], args: tuple, rdzv: Rendezvous,
                 timeout_seconds: float) -> None:
    """Entry point of one worker: set up the group and mesh, run fn, tear down."""
    spawned = external_rendezvous() is None
    rank = local_index if spawned else rdzv.rank
    local_rank = local_index if spawned else rdzv.local_rank
    os.environ.update(MASTER_ADDR=rdzv.addr, MASTER_PORT=str(rdzv.port),
                      RANK=str(rank), WORLD_SIZE=str(rdzv.world), LOCAL_RANK=str(local_rank))
    device, backend = _device_and_backend(local_rank)
    dist.init_process_group(backend, rank=rank, world_size=rdzv.world,
                            timeout=datetime.timedelta(seconds=timeout_seconds),
                            device_id=device if device.type == "cuda" else None)
    try:
        mesh = init_device_mesh(device.type, (rdzv.world,))
        ctx = WorkerContext(rank=rank, world=rdzv.world, local_rank=local_rank, device=device, mesh=mesh)
        fn(ctx, *args)
        # Leave together: a worker tearing down its group while a peer still
        # talks to it can abort the peer's gloo threads.
        dist.barrier(group=mesh.get_group())
        # Free the run's sharded tensors and meshes while the group still exists:
        # left to interpreter shutdown, gloo objects in reference cycles are
        # destroyed too late and abort the process ("terminate called without
        # an active exception", about one run in ten before this).
        del ctx, mesh
        gc.collect()
    except Exception:
        # The parent reports the rank and the error's last line; the full
        # traceback only when asked, so a user sees one clean line.
        if spawned and os.environ.get("SHARDSCHED_DEBUG"):
            traceback.print_exc()
        raise
    finally:
        _destroy()


def _destroy() -> None:
    try:
        dist.destroy_process_group()
    except Exception:  # a group broken by a dead peer cannot always be torn down cleanly
        pass
