"""A run's console output, kept in its run directory (`train.log`).

Rank 0 tees what it prints (progress, warnings, the final table) into
RUN_DIR/train.log, and the parent appends the line that ends the run (a failed
worker, an interrupt), so a run's story survives the terminal. The file is
opened on the first write, so a run that prints nothing creates none.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

LOG_NAME = "train.log"


class _Tee:
    """A text stream that writes to `stream` and appends to `path`."""

    def __init__(self, stream: TextIO, path: Path):
        self.stream, self.path, self.file = stream, path, None

    def write(self, text: str) -> int:
        if text:
            if self.file is None:
                self.file = open(self.path, "a", encoding="utf-8")
            self.file.write(text)
            self.file.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding, ... of the real stream
        return getattr(self.stream, name)


@contextmanager
def tee_output(run_dir: str, *, enabled: bool = True) -> Iterator[None]:
    """While the body runs, sys.stdout and sys.stderr also go to RUN_DIR/train.log."""
    if not enabled:
        yield
        return
    path = Path(run_dir) / LOG_NAME
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(old[0], path), _Tee(old[1], path)
    try:
        yield
    finally:
        for tee in (sys.stdout, sys.stderr):
            if isinstance(tee, _Tee) and tee.file is not None:
                tee.file.close()
        sys.stdout, sys.stderr = old


def report(run_dir: str, line: str) -> None:
    """The run's last word: stderr, and train.log once the run has started (its
    plan.json is written only after start-up and resume succeeded)."""
    print(line, file=sys.stderr, flush=True)
    path = Path(run_dir) / LOG_NAME
    if path.is_file() or (Path(run_dir) / "plan.json").is_file():
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
