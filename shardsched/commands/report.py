"""`shardsched report RUN_DIR`: one PNG of a training run (`report.run`)."""
from __future__ import annotations

import argparse

from shardsched.report.run import REPORT_NAME, write_report


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `shardsched train`")
    p.add_argument("--out", default=None, help=f"PNG to write (default RUN_DIR/{REPORT_NAME})")


def run_report(args: argparse.Namespace) -> int:
    path = write_report(args.run_dir, args.out)
    print(f"report: wrote {path}")
    return 0
