"""Start workers, or join the ones a cluster launcher started.

`launch(fn, nproc=..., args=...)` runs `fn(ctx, *args)` on every worker, where
`ctx` is a `WorkerContext` holding the rank, world and a 1-D DeviceMesh.

- Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK) or inside a SLURM job step
  (SLURM_PROCID / SLURM_NTASKS / SLURM_STEP_ID, see [Note: SLURM without
  MASTER_ADDR]) this process is one worker: it joins the existing group and
  runs `fn` itself; an --nproc that disagrees is refused (`check_nproc`).
- Otherwise it spawns `nproc` local workers; their store listens on 127.0.0.1 only.

gloo on CPU, NCCL (device cuda:LOCAL_RANK) when CUDA is present. A worker that
fails stops the whole run: the parent (`supervise`) terminates the others and
raises `WorkerFailed` naming the rank; the process group's timeout bounds any
wait for a peer that is gone, so nothing hangs. SIGINT/SIGTERM stop all
workers at one step boundary (`interrupt`).
"""
from __future__ import annotations

import datetime
import gc
import logging
import os
import re
import socket
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from shardsched.errors import UsageError
from shardsched.train.interrupt import Interrupted, install_handlers
from shardsched.train.start import Inherited, context, start_method
from shardsched.train.supervise import WorkerFailed, supervise  # noqa: F401 (callers catch WorkerFailed)

DEFAULT_TIMEOUT_SECONDS = 180.0
"""Collective timeout: a peer that died mid-step ends the wait after this long."""


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
    local_world: int = 1
    """Workers on this node (gpus_per_node of the plan this run makes)."""
    launcher: str = "local"
    """Who started the workers: "local" (spawned here), "torchrun" or "SLURM"."""
    addr: str
    """MASTER_ADDR of the TCP store."""
    port: int
    """MASTER_PORT of the TCP store."""


def external_rendezvous(env: dict[str, str] | None = None) -> Rendezvous | None:
    """The rendezvous set up by torchrun or a SLURM job step, or None when run
    stand-alone (and in an sbatch script outside `srun`: a single process).

    [Note: SLURM without MASTER_ADDR] SLURM never sets MASTER_ADDR. Inside a
    step (SLURM_STEP_ID set by srun) every task is one worker: the store runs on
    the step's first host (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, expanded
    here) on a port derived from the job and step ids, so tasks of one step meet
    and two steps or jobs on one node do not. A step never spawns local workers."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _env_int(env, "WORLD_SIZE", lo=1)
        return Rendezvous(rank=_env_int(env, "RANK", lo=0, hi=world - 1), world=world,
                          local_rank=_env_int(env, "LOCAL_RANK", 0, lo=0),
                          local_world=_env_int(env, "LOCAL_WORLD_SIZE", world, lo=1),
                          addr=env.get("MASTER_ADDR", "127.0.0.1"),
                          port=_env_int(env, "MASTER_PORT", 29500, lo=1, hi=65535), launcher="torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and ("SLURM_STEP_ID" in env or "MASTER_ADDR" in env):
        world = _env_int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS", lo=1)
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_STEP_TASKS_PER_NODE") \
            or env.get("SLURM_TASKS_PER_NODE") or str(world)
        return Rendezvous(rank=_env_int(env, "SLURM_PROCID", lo=0, hi=world - 1), world=world,
                          local_rank=_env_int(env, "SLURM_LOCALID", 0, lo=0),
                          local_world=_first_count(per_node, world),
                          addr=env.get("MASTER_ADDR") or first_host(nodes),
                          port=_env_int(env, "MASTER_PORT", slurm_port(env), lo=1, hi=65535), launcher="SLURM")
    return None


def _env_int(env, key: str, default: int | None = None, *, lo: int, hi: int | None = None) -> int:
    raw = env.get(key)
    if raw is None and default is not None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise UsageError(f"environment variable {key}={raw!r} is not an integer (set by torchrun or SLURM)") from None
    if value < lo or (hi is not None and value > hi):
        raise UsageError(f"environment variable {key}={value} is out of range ({lo}..{hi})")
    return value


def _first_count(tasks_per_node: str, default: int) -> int:
    """'2(x3),1' -> 2: SLURM's tasks-per-node list, first node's count."""
    m = re.match(r"\s*(\d+)", tasks_per_node)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else default


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'node[01-03,07],gpu5' -> 'node01',
    'rack[1-2]-n[3-4]' -> 'rack1-n3' (as `scontrol show hostnames` would list first)."""
    first, depth = "", 0
    for ch in nodelist.strip():  # the first comma-separated entry outside brackets
        if ch == "," and depth == 0:
            break
        depth += (ch == "[") - (ch == "]")
        first += ch
    # each bracket group: its first item, and of a range its lower end (keeping zero padding)
    host = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], first)
    if not host:
        raise UsageError(f"cannot read the first host of SLURM_JOB_NODELIST={nodelist!r}")
    return host


def slurm_port(env) -> int:
    """A port the tasks of one step agree on without talking: from the job and step ids,
    in 20000..39999 (below Linux's ephemeral range 32768.. only partly; collisions
    need two steps whose ids agree modulo 20000 on one node)."""
    job = _env_int(env, "SLURM_JOB_ID", 0, lo=0)
    step = _env_int(env, "SLURM_STEP_ID", 0, lo=0) if str(env.get("SLURM_STEP_ID", "0")).isdigit() else 0
    return 20000 + (job * 31 + step) % 20000


def check_nproc(nproc: int | None) -> int:
    """Workers of this run: the launcher's world under torchrun/SLURM (an
    --nproc that disagrees is an error, never silently ignored), else --nproc (default 2)."""
    rdzv = external_rendezvous()
    if rdzv is None:
        return 2 if nproc is None else nproc
    if nproc is not None and nproc != rdzv.world:
        raise UsageError(f"--nproc {nproc} disagrees with {rdzv.launcher}, which started {rdzv.world} workers; "
                         f"leave --nproc out under {rdzv.launcher} or start {nproc} tasks")
    return rdzv.world


def local_world_size(world: int) -> int:
    """Workers per node of the running group (the LOCAL_WORLD_SIZE each worker gets)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    except ValueError:
        return world


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Any], *, nproc: int, args: tuple = (),
           timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """Run fn(ctx, *args) on every worker. Raises WorkerFailed if a worker fails,
    `Interrupted` if the run was stopped by SIGINT/SIGTERM, UsageError for bad
    input found inside a worker."""
    rdzv = external_rendezvous()
    if rdzv is not None:
        install_handlers()
        _worker_main(rdzv.local_rank, fn, args, rdzv, timeout_seconds)
        _JOINED[0] = True  # [Note: a launched worker leaves without finalisation]
        return
    rdzv = Rendezvous(rank=0, world=nproc, local_rank=0, local_world=nproc, addr="127.0.0.1", port=free_port())
    # torch logs one warning per worker it terminates; our own message names the culprit.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    method = start_method()  # [Note: workers forked from a preloaded server]
    state = context(method).Array("q", 2 * nproc, lock=False)  # per worker: finished?, steps at stop
    pc = mp.start_processes(_spawned_main, args=(fn, args, rdzv, timeout_seconds, state, Inherited()),
                            nprocs=nproc, join=False, start_method=method)
    supervise(pc, state)


# [Note: a launched worker leaves without finalisation]
# A worker torchrun or SLURM started runs the command itself; once its group is torn down
# (`_worker_main`) and the command has finished, the interpreter's finalisation still destroys
# what gloo's worker threads and FSDP2's state hold, and now and then that aborts the process
# ("terminate called without an active exception", SIGABRT: once in CI, rank 1 of a 2-worker
# torchrun run whose training had finished; torchrun then reports the run failed). PyTorch's own
# discussion of it (pytorch/pytorch#179291) found no general fix. So the command's exit status
# is final there: its streams flushed and logging shut down, the process exits without
# finalisation (`os._exit`), as a stopped local worker already does. Locally spawned workers
# leave through `_spawned_main`, whose parent reads their finished flags.
_JOINED = [False]
"""Whether this process ran `launch`'s work as a worker torchrun or SLURM started."""


def leave(code: int) -> int:
    """`code`, or, in a worker torchrun or SLURM started that ran `launch`, exit with it now
    ([Note: a launched worker leaves without finalisation])."""
    if not _JOINED[0]:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _spawned_main(local_index: int, fn, args: tuple, rdzv: Rendezvous, timeout_seconds: float, state,
                  inherited: Inherited) -> None:
    """A locally started worker: records a clean finish, exits 128+signal when stopped."""
    inherited.apply()
    install_handlers()
    try:
        _worker_main(local_index, fn, args, rdzv, timeout_seconds)
    except Interrupted as e:
        state[2 * local_index + 1] = e.step or 0
        # The group is torn down and the checkpoint written: leave now. Interpreter
        # finalisation with torch loaded takes seconds on a busy machine (measured
        # 3-9 s at load 11 on 2 cores), and a stop must be prompt.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.exit_code)
    state[2 * local_index] = 1


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
    os.environ.update(MASTER_ADDR=rdzv.addr, MASTER_PORT=str(rdzv.port), RANK=str(rank),
                      WORLD_SIZE=str(rdzv.world), LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(rdzv.local_world))
    if spawned:  # all workers are on this machine: gloo's sockets on loopback too
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device, backend = _device_and_backend(local_rank)
    timeout = datetime.timedelta(seconds=timeout_seconds)
    dist.init_process_group(backend, rank=rank, world_size=rdzv.world, timeout=timeout,
                            store=_store(rdzv, rank=rank, timeout=timeout, local=spawned),
                            device_id=device if device.type == "cuda" else None)
    failed = False
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
    except Interrupted as e:
        # As above: free what the stopped run holds (its frames, reachable from
        # the traceback) while the group exists; left to interpreter exit, the
        # teardown took ~9 s per worker.
        traceback.clear_frames(e.__traceback__)
        e.__traceback__ = None
        ctx = mesh = None  # noqa: F841
        gc.collect()
        raise e from None
    except Exception:
        # The parent reports the rank and the error's last line; the full
        # traceback only when asked, so a user sees one clean line.
        if spawned and os.environ.get("SHARDSCHED_DEBUG"):
            traceback.print_exc()
        failed = True
        raise
    finally:
        # Not on a failure: torch's spawn wrapper writes the traceback the parent
        # reports only after we return, and tearing down a group whose peer is
        # mid-collective can abort this process first (SIGABRT, nothing reported).
        if not failed:
            _destroy()


def _store(rdzv: Rendezvous, *, rank: int, timeout: datetime.timedelta, local: bool) -> dist.TCPStore | None:
    """The rendezvous store of local workers: rank 0 listens on 127.0.0.1 only
    (TCPStore would otherwise listen on every interface), binding the socket
    itself and handing it over (`master_listen_fd`). Under torchrun/SLURM: None,
    so init_process_group uses env:// (torchrun's agent store, or MASTER_ADDR)."""
    if not local:
        return None
    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", rdzv.port))
        sock.listen(max(128, rdzv.world))
        store = dist.TCPStore("127.0.0.1", rdzv.port, rdzv.world, True, timeout,
                              master_listen_fd=sock.detach())
        return store
    return dist.TCPStore(rdzv.addr, rdzv.port, rdzv.world, rank == 0, timeout)


def _destroy() -> None:
    try:
        dist.destroy_process_group()
    except Exception:  # a group broken by a dead peer cannot always be torn down cleanly
        pass
