"""Output paths: checked before any work starts, written atomically.

Every command that writes (`plan --out/--trace`, `train --run-dir`, ...) checks
its paths here first, so a path that is a directory, lies under a file, or sits
on a read-only or missing filesystem is one line and exit 2 before anything
runs, and nothing is left behind (the probe file is removed again).
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from shardsched.errors import UsageError


def _why(e: OSError) -> str:
    return e.strerror or errno.errorcode.get(e.errno or 0, str(e))


def _nearest_existing(path: Path) -> Path:
    """The deepest existing ancestor of path (path itself if it exists)."""
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _probe_dir(directory: Path, flag: str, shown: str) -> None:
    """Create and remove a file in directory: the only check that also catches
    read-only mounts and permission rules os.access does not see."""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".shardsched-probe-")
    except OSError as e:
        raise UsageError(f"{flag} {shown}: cannot write in {directory} ({_why(e)}); "
                         f"accepted: a path in a writable directory") from None
    os.close(fd)
    os.unlink(tmp)


def check_writable_file(path: str, flag: str) -> Path:
    """A file path that can be (over)written: not empty, not a directory, its
    directory exists and is writable. Nothing is created."""
    if not path or not path.strip():
        raise UsageError(f"{flag} is empty; accepted: a file path")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory; accepted: a file path")
    parent = p.parent if str(p.parent) else Path(".")
    existing = _nearest_existing(parent)
    if existing != parent:
        why = f"{existing} is not a directory" if not existing.is_dir() else f"directory {parent} does not exist"
        raise UsageError(f"{flag} {path}: {why}; accepted: a file in an existing directory")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a directory; accepted: a file in an existing directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable; accepted: a writable file path")
    _probe_dir(parent, flag, path)
    return p


def check_run_dir(path: str, flag: str = "--run-dir") -> Path:
    """A directory that exists and is writable, or can be created (its nearest
    existing ancestor is a writable directory). Nothing is created."""
    if not path or not path.strip():
        raise UsageError(f"{flag} is empty; accepted: a directory path")
    p = Path(path)
    existing = _nearest_existing(p)
    if not existing.is_dir():
        where = "is a file" if existing == p else f"lies under the file {existing}"
        raise UsageError(f"{flag} {path} {where}; accepted: a directory path")
    _probe_dir(existing, flag, path)
    return p


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write via a temporary file in the same directory and rename, so a
    failure never leaves half a file nor the temporary one."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
