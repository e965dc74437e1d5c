"""A run's console output, kept in its run directory (`train.log`).

Rank 0 tees what it prints into RUN_DIR/train.log (`train.progress.logged_output`);
the parent appends the line that ends the run (a failed worker, an interrupt), so a
run's story survives the terminal.
"""
from __future__ import annotations

import sys
from pathlib import Path

LOG_NAME = "train.log"


def report(run_dir: str, line: str) -> None:
    """The run's last word: stderr, and train.log once the run has started (its
    plan.json is written only after start-up and resume succeeded)."""
    print(line, file=sys.stderr, flush=True)
    path = Path(run_dir) / LOG_NAME
    if path.is_file() or (Path(run_dir) / "plan.json").is_file():
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
