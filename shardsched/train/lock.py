"""One run at a time per run directory: an advisory lock file.

`RUN_DIR/.lock` is held with `fcntl.flock` for the whole run and names its
owner (pid, host, start time), so a second run on the same directory stops at
once with one line saying who holds it. The kernel drops the lock when the
owner dies, so a crashed run never leaves a stale lock behind (the file may
stay; its content is only informative). Directories created for the run are
removed again if the run leaves nothing in them (a failed start changes
nothing).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from shardsched.errors import UsageError

LOCK_NAME = ".lock"


def _created_dirs(run_dir: Path) -> list[Path]:
    """The directories `mkdir -p run_dir` creates, deepest first."""
    missing, p = [], run_dir.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing


def _owner(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _acquire(path: Path, run_dir: Path) -> int:
    """An fd holding the lock on the file now at `path`. A holder unlinks the
    file before it lets go, so a lock taken on a file that is no longer at
    `path` is worthless: try again on the new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"run directory {run_dir} is in use by {_owner(path)}; wait for that run to end "
                             f"or pick another --run-dir") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def run_dir_lock(run_dir: str | os.PathLike, *, enabled: bool = True) -> Iterator[None]:
    """Hold RUN_DIR/.lock while the body runs; UsageError if another run holds it."""
    if not enabled:
        yield
        return
    run_dir = Path(run_dir)
    created = _created_dirs(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = _acquire(path, run_dir)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        yield
    finally:
        os.unlink(path)  # still ours: we hold the lock
        os.close(fd)
        for d in created:  # deepest first; stops at the first that holds something
            try:
                d.rmdir()
            except OSError:
                break
