"""Progress of a training run that reads anywhere, and RUN_DIR/train.log.

Three ways to show progress (rank 0 only; every other worker is silent):
- a terminal: a live rich bar with loss, tokens/s and the time left;
- anything else (a pipe, a file, CI, a SLURM log): one plain line at the
  start, every `every` steps and at the end, so `make train > log` is never
  minutes of silence;
- `--quiet`: neither.
Whatever the mode, the plain lines and everything else rank 0 prints (the
summary table, notes, warnings) are also appended to RUN_DIR/train.log.
"""
from __future__ import annotations

import contextlib
import enum
import sys
import time
from pathlib import Path
from typing import Iterator, TextIO

LOG_NAME = "train.log"
LINES_PER_RUN = 10
"""Plain lines between start and end when --log-every is not given."""


class ProgressMode(enum.Enum):
    BAR = "bar"
    LINES = "lines"
    QUIET = "quiet"


def progress_mode(*, quiet: bool, stream: TextIO) -> ProgressMode:
    if quiet:
        return ProgressMode.QUIET
    return ProgressMode.BAR if stream.isatty() else ProgressMode.LINES


def default_every(*, start: int, total: int) -> int:
    return max(1, (total - start) // LINES_PER_RUN)


class _Tee:
    """A text stream that writes to the terminal (unless quiet) and to the log file."""

    def __init__(self, stream: TextIO, log: TextIO, *, show: bool):
        self.stream, self.log, self.show = stream, log, show

    def write(self, text: str) -> int:
        if self.show:
            self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


class RunLog:
    """RUN_DIR/train.log, opened only once the run has started (`open`): until then what is
    written is held in memory, so a refused start (a budget no plan fits, a layer override
    that names nothing, a bad --plan) leaves no run directory, or an existing one as it was."""

    def __init__(self, path: Path):
        self.path, self.held, self.file = path, [], None

    def open(self) -> None:
        if self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", buffering=1)
            self.file.write("".join(self.held))
            self.held = []

    def write(self, text: str) -> int:
        if self.file is None:
            self.held.append(text)
        else:
            self.file.write(text)
        return len(text)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@contextlib.contextmanager
def logged_output(run_dir: str, *, enabled: bool) -> Iterator[RunLog | None]:
    """While open, what this process prints also goes to RUN_DIR/train.log (appended:
    a resumed run continues the log) once the caller opens it (`RunLog`). Yields the log,
    or None when not enabled."""
    if not enabled:
        yield None
        return
    out, err = sys.stdout, sys.stderr
    log = RunLog(Path(run_dir) / LOG_NAME)
    sys.stdout, sys.stderr = _Tee(out, log, show=True), _Tee(err, log, show=True)
    try:
        yield log
    finally:
        sys.stdout, sys.stderr = out, err
        log.close()


class Progress:
    """The progress of one run on rank 0 (see the module docstring for the modes)."""

    def __init__(self, *, mode: ProgressMode, start: int, total: int, every: int,
                 log: TextIO | None = None, terminal: TextIO | None = None, unit: str = "tok"):
        self.mode, self.start, self.total, self.every, self.log = mode, start, total, every, log
        self.unit = unit  # what the throughput counts: "tok", "img" (vision models), "rows" or "batches"
        self.last = start  # the last step finished: an interrupted run stops before `total`
        self.t0 = time.perf_counter()
        self.extra = ""
        self.bar = None
        if mode is ProgressMode.BAR:
            self.bar = _rich_bar(terminal or sys.__stdout__, start=start, total=total)

    def _emit(self, line: str) -> None:
        """A plain line: on the terminal in LINES mode, in the log file always."""
        if self.mode is ProgressMode.LINES:
            print(line, flush=True)  # through the tee: terminal and log
        elif self.log is not None:
            self.log.write(line + "\n")

    def begin(self, what: str) -> None:
        self._emit(f"train: {what}; steps {self.start + 1}-{self.total}")

    def update(self, step: int, *, loss: float, tokens_per_s: float, step_seconds: float,
               val_loss: float | None = None) -> None:
        self.last = step
        info = f"loss {loss:.4f}  {tokens_per_s:,.0f} {self.unit}/s{self.extra}"
        if self.bar is not None:
            progress, task = self.bar
            progress.update(task, completed=step, info=info)
        if step % self.every == 0 or step == self.total or val_loss is not None:
            val = f"  val {val_loss:.4f}" if val_loss is not None else ""
            self._emit(f"step {step}/{self.total}  loss {loss:.4f}{val}  {tokens_per_s:,.0f} {self.unit}/s  "
                       f"{step_seconds * 1e3:.1f} ms/step  eta {self._eta(step)}")

    def _eta(self, step: int) -> str:
        done = step - self.start
        left = (time.perf_counter() - self.t0) / done * (self.total - step) if done else 0.0
        return f"{int(left // 60)}:{int(left % 60):02d}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar[0].stop()
        elapsed = time.perf_counter() - self.t0
        ran = f"{self.last - self.start} steps in {elapsed:.1f} s"
        if self.last < self.total:  # interrupted (a signal, a failed worker): never "done"
            self._emit(f"train: stopped at step {self.last} of {self.total} ({ran})")
        else:
            self._emit(f"train: done, {ran}")


def _rich_bar(stream: TextIO, *, start: int, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn
    progress = RichProgress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                            console=Console(file=stream))
    task = progress.add_task("train", total=total, completed=start, info="")
    progress.start()
    return progress, task
