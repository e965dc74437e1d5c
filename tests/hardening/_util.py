"""Shared by the hardening tests: run a command in-process and check the
"bad input" contract (exit 2, one line on stderr, no traceback, nothing written)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from shardsched.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under root with a hash of its content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_rejected(argv: list[str], root: Path, capsys, fragment: str | None = None) -> str:
    """argv must exit 2 with exactly one stderr line, no traceback, and leave root unchanged."""
    before = snapshot(root)
    rc, _, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2, (argv, rc, err[-2000:])
    assert len(lines) == 1 and "Traceback" not in err, (argv, err[-2000:])
    if fragment is not None:
        assert fragment in lines[0], (argv, lines[0])
    assert snapshot(root) == before, argv
    return lines[0]
