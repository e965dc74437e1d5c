"""Keeping stdout for the document: native libraries must not write on it.

[Note: why file descriptors, not sys.stdout]
A native library (HiGHS 1.16 prints a "Running HiGHS ... Copyright" banner the first
time a `Highs` object is made in a process) writes with C's stdio straight to file
descriptor 1; swapping Python's `sys.stdout` does not reach it. So both guards below
move descriptor 1 itself with `os.dup2`:
- `native_quiet()` wraps the one call site that may chatter (solve/milp/highs.py): the
  silence is at the source, for every command, `train`'s console included;
- `document_stdout()` wraps a whole `--json` command (cli.main): descriptor 1 points
  at stderr while the command runs, and `sys.stdout` is a stream on the saved,
  original descriptor, so the document is the only thing on stdout even if some
  other library speaks up.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def _fd1_to(target_fd: int) -> Iterator[int]:
    """Point descriptor 1 at `target_fd` for the block; yields a dup of the original."""
    _flush()
    saved = os.dup(1)
    os.dup2(target_fd, 1)
    try:
        yield saved
    finally:
        _flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def native_quiet() -> Iterator[None]:
    """Whatever native code writes on descriptor 1 in the block is dropped."""
    with open(os.devnull, "w") as null, _fd1_to(null.fileno()):
        yield


@contextlib.contextmanager
def document_stdout() -> Iterator[None]:
    """Descriptor 1 goes to stderr; `sys.stdout` writes to the real stdout (the document).

    When `sys.stdout` is not descriptor 1 (pytest's capsys, a caller's StringIO) the
    document stays where the caller sent it; only descriptor 1 is moved."""
    try:
        on_fd1 = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):
        on_fd1 = False
    with _fd1_to(2) as saved:
        if not on_fd1:
            yield
            return
        doc = os.fdopen(os.dup(saved), "w", encoding="utf-8")
        old, sys.stdout = sys.stdout, doc
        try:
            yield
        finally:
            sys.stdout = old
            doc.close()
