"""SIGINT / SIGTERM: stop every worker at the same step, cleanly.

A signal may reach any subset of the workers (Ctrl-C reaches the whole
foreground process group; `kill` one process; srun and torchrun forward to
every task; the parent forwards what it receives). Each worker only records it
(`install_handlers`); at every step boundary the workers agree by an all-reduce
(MAX) of what they recorded (`agreed_signal`), so all of them stop after the
same step, can write a final checkpoint together (DCP saves are collective) and
leave with `Interrupted`. The process then exits 128 + signal number (130 for
SIGINT, 143 for SIGTERM), the shell convention.

[Note: why not KeyboardInterrupt] torch.multiprocessing's worker wrapper
swallows KeyboardInterrupt and exits 0, so a worker interrupted that way looked
finished and its peer, stuck in the next collective, was blamed for the failure.
"""
from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []
"""Signals this process received (per process, as signal dispositions are)."""


class Interrupted(Exception):
    """The run stopped on a signal after `step` steps."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.step = step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _record(signum, _frame) -> None:
    _received.append(signum)


def install_handlers() -> None:
    """Record SIGINT/SIGTERM instead of dying (main thread only, as Python requires)."""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _record)


def received() -> int:
    """The first signal this process received, or 0."""
    return _received[0] if _received else 0


def agreed_signal(mesh: DeviceMesh) -> int:
    """Collective: the signal some worker received (0: none), the same on every worker."""
    t = torch.tensor([received()], dtype=torch.int64, device=_device(mesh))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=mesh.get_group())
    return int(t.item())


def _device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)
