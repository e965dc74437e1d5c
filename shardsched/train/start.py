"""How the launcher starts local workers: forked from a server that imported torch once.

[Note: workers forked from a preloaded server]
A spawned worker is a fresh interpreter: it imports torch, FSDP2 and torch._dynamo (which
FSDP2's `fully_shard` pulls in) before it does anything, ~3 CPU s each on a 2-core machine,
paid by every worker of every run. On a machine without CUDA the workers are started with
multiprocessing's "forkserver" method instead: one server process imports those modules once
(`PRELOAD`) and every worker is a fork of it. The server is a clean interpreter started for
this purpose (no locks, threads or open files of this process); it stays up for the life of
this process, so a second run started from the same process forks at once.

Python's forkserver already gives each worker the parent's current working directory and
`sys.path` (`multiprocessing.spawn.prepare`); what it would not give is what changed since
the server started: the environment and where stdout/stderr point (a test's captured
streams, a log the caller redirected). `Inherited` carries both, as a spawned worker would
have them. With CUDA the workers are spawned as before: a process that may have touched the
driver must not be forked, and the GPU start-up dwarfs the imports anyway.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.reduction
import os
import sys

PRELOAD = ("torch", "torch.distributed.fsdp", "torch._dynamo", "torch.distributed.checkpoint",
           "shardsched.train.trainer")
"""Imported once by the fork server: what every worker needs before its first step."""


def start_method() -> str:
    """"forkserver" on a machine without CUDA, else "spawn" ([Note: workers forked from a
    preloaded server]). SHARDSCHED_START_METHOD=spawn|forkserver chooses."""
    import torch
    chosen = os.environ.get("SHARDSCHED_START_METHOD")
    if chosen in ("spawn", "forkserver"):
        return chosen
    return "spawn" if torch.cuda.is_available() else "forkserver"


def context(method: str):
    """The multiprocessing context for `method`, its server told what to preload."""
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))  # read when the server first starts
    return ctx


class Inherited:
    """The environment and standard streams of the parent at launch, for a worker forked
    from a server started earlier. Pickled while the worker starts, so its file
    descriptors travel with it (`multiprocessing.reduction.DupFd`)."""

    def __init__(self, env: dict[str, str] | None = None, fds: tuple | None = None):
        self.env = dict(os.environ) if env is None else env
        self.fds = fds

    def __reduce__(self):
        # stdout and stderr as file descriptors, as a spawned worker inherits them; a stream
        # this process started without (`>&-`: Python's sys.__stdout__ is None) is not passed,
        # since its number may since name another file
        fds = tuple(multiprocessing.reduction.DupFd(fd) if stream is not None else None
                    for fd, stream in ((1, sys.__stdout__), (2, sys.__stderr__)))
        return (Inherited, (self.env, fds))

    def apply(self) -> None:
        """In the worker: take the parent's environment and standard streams."""
        os.environ.clear()
        os.environ.update(self.env)
        for target, fd, name in zip((1, 2), self.fds or (None, None), ("stdout", "stderr")):
            if fd is None:
                continue
            if getattr(sys, name) is not None:
                getattr(sys, name).flush()
            got = fd.detach()
            if got != target:
                os.dup2(got, target)
                os.close(got)
            if getattr(sys, name) is None:  # the server started without it
                setattr(sys, name, open(target, "w", buffering=1, closefd=False))
