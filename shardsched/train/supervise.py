"""The parent of locally spawned workers: watch them, stop them, name the culprit.

`supervise(pc, state)` waits for the workers `torch.multiprocessing` started
(join=False) and turns how they ended into one outcome:

- all finished (exit 0 and `state` says so): return;
- one failed: terminate the rest and raise `WorkerFailed` naming the worker
  that failed first. Workers that ended in the same poll are ranked by cause:
  killed by a signal or gone early with status 0 before one that raised, since
  a dead peer makes the others raise (gloo: connection closed) a moment later;
- the parent got SIGINT/SIGTERM: forward it to the workers, which stop together
  at the next step boundary (`interrupt`), give them GRACE_SECONDS, kill what is
  left and raise `Interrupted` (a second signal kills at once). Workers that all
  left with 128+signal (a signal sent to them directly) are `Interrupted` too.
"""
from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import threading
import time

from shardsched.errors import UsageError
from shardsched.train.interrupt import SIGNALS, Interrupted

GRACE_SECONDS = 20.0
"""After a signal: time for the workers to reach a step boundary and write a final checkpoint."""
POLL_SECONDS = 0.1


class WorkerFailed(RuntimeError):
    """A worker raised or was killed; the message names its rank."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


_USAGE_PREFIX = f"{UsageError.__module__}.{UsageError.__qualname__}: "


def _last_line(text: str) -> str:
    """The exception's first line: the first unindented line after the traceback's last
    frame (a message of several lines, e.g. torch.utils.checkpoint's, would otherwise be
    named by its tail)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith("  ")]
    start = frames[-1] + 1 if frames and frames[-1] + 1 < len(lines) else len(lines) - 1
    return lines[start].strip() if lines else "unknown error"


class _ParentSignals:
    """Record SIGINT/SIGTERM in the parent while workers run (main thread only)."""

    def __init__(self):
        self.received: list[int] = []
        self.saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.saved = {s: signal.signal(s, lambda n, _f: self.received.append(n)) for s in SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)


def _is_graceful(code: int | None) -> bool:
    return code is not None and code in {128 + s for s in SIGNALS}


def _failure(i: int, code: int, finished: bool, error_file: str) -> tuple[int, Exception] | None:
    """(priority, exception) when worker i's exit is a failure; lower priority is blamed first."""
    if code == 0:
        if finished:
            return None
        return 0, WorkerFailed(i, f"worker {i} exited with status 0 before the run finished")
    if _is_graceful(code):
        return None
    # A traceback the worker wrote names the cause even when the process then died of
    # a signal: gloo can abort a process at exit, after the wrapper wrote the error.
    if error_file and os.path.exists(error_file) and os.path.getsize(error_file):
        with open(error_file, "rb") as fh:
            last = _last_line(pickle.load(fh))  # a traceback string that torch's wrapper wrote
        if last.startswith(_USAGE_PREFIX):
            return 1, UsageError(last[len(_USAGE_PREFIX):])  # bad input found inside a worker
        return 1, WorkerFailed(i, f"worker {i} failed: {last}")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return 0, WorkerFailed(i, f"worker {i} was killed by {name}")
    return 0, WorkerFailed(i, f"worker {i} exited with status {code}")


def _written_at(error_file: str) -> int:
    """When a worker wrote its traceback (ns): of two that raised in one poll, the
    earlier is the cause, the later usually its peer's 'connection closed'."""
    try:
        return os.stat(error_file).st_mtime_ns
    except (OSError, TypeError):
        return 0


def _stop_all(procs, *, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds, for every worker still alive."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def supervise(pc, state, *, grace: float = GRACE_SECONDS) -> None:
    """Wait for the workers of ProcessContext `pc`; see the module docstring."""
    procs, n = pc.processes, len(pc.processes)
    seen: dict[int, int] = {}  # worker -> poll in which its exit was first seen
    with _ParentSignals() as sig:
        deadline, poll = None, 0
        while True:
            poll += 1
            for i, p in enumerate(procs):
                if i not in seen and p.exitcode is not None:
                    seen[i] = poll
            failures = [(seen[i], f[0], _written_at(pc.error_files[i]), i, f[1]) for i in seen
                        if (f := _failure(i, procs[i].exitcode, bool(state[2 * i]), pc.error_files[i]))]
            if failures:
                _stop_all(procs, grace=1.0)
                raise min(failures, key=lambda t: t[:4])[4]
            if len(seen) == n:
                break
            if sig.received and deadline is None:
                deadline = time.monotonic() + grace
                for p in procs:
                    if p.is_alive():
                        os.kill(p.pid, sig.received[0])
            if deadline is not None and (len(sig.received) > 1 or time.monotonic() > deadline):
                _stop_all(procs, grace=0.0)
                break
            alive = [p.sentinel for p in procs if p.exitcode is None]
            multiprocessing.connection.wait(alive, timeout=POLL_SECONDS)
    codes = [p.exitcode for p in procs]
    if sig.received or any(_is_graceful(c) for c in codes):
        signum = sig.received[0] if sig.received else next(c - 128 for c in codes if _is_graceful(c))
        steps = [state[2 * i + 1] for i in range(n) if _is_graceful(codes[i])]
        raise Interrupted(signum, max(steps) if steps else None)
