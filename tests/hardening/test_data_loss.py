"""Nothing in a run directory is lost or runs code: a second run on the same
directory stops at once; a forged checkpoint `.metadata` that would run code is
refused without being unpickled; a COMPLETE marker listing no files marks its
checkpoint unusable; resume falls back to the newest good checkpoint."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

from shardsched.cli import main
from shardsched.train import checkpoint as ckpt
from shardsched.train.launcher import launch
from shardsched.train.safe_dcp import SafeFileSystemReader, UnsafeCheckpoint

from tests.train._helpers import TINY, tiny_config, train_worker

ARGS = ["--model", TINY, "--seq", "16", "--batch", "4", "--strategy", "full_shard", "--nproc", "2", "--quiet"]


def _rows(run) -> list[int]:
    return [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_runs_on_one_directory(tmp_path, capsys):
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "shardsched", "train", *ARGS, "--steps", "25",
                              "--run-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while not (run / ".lock").exists():
        assert first.poll() is None and time.monotonic() < end, first.communicate()
        time.sleep(0.05)
    t0 = time.monotonic()
    rc = main(["train", *ARGS, "--steps", "25", "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and time.monotonic() - t0 < 30
    assert err.count("\n") == 1 and f"in use by pid {first.pid}" in err, err
    out, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert _rows(run) == list(range(1, 26))  # one run's lines, each step once
    assert not (run / ".lock").exists()


class _WritesAFile:
    """What a forger pickles: unpickling it normally runs os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _reseal(directory):
    """Recompute COMPLETE as a forger would: the checksums do not protect anything."""
    (directory / ckpt.MARKER).write_text(json.dumps({"step": int(directory.name[5:]),
                                                     "files": ckpt._manifest(directory)}))


def test_forged_metadata_never_runs_and_empty_complete_falls_back(tmp_path, capsys):
    run = tmp_path / "run"
    launch(train_worker, nproc=2, args=(tiny_config(str(run), steps=6, checkpoint_every=2, batch=4),))
    (run / "config.json").write_text(json.dumps({**json.loads((run / "config.json").read_text()), "quiet": True}))
    uninterrupted = dict(zip(_rows(run), [json.loads(ln)["loss"] for ln in
                                          (run / "metrics.jsonl").read_text().splitlines()]))
    cdir = ckpt.checkpoint_dir(run)
    marker = tmp_path / "PWNED"
    # step 6: metadata that runs code when unpickled (a valid pickle, resealed checksums).
    (cdir / "step_000006" / ".metadata").write_bytes(pickle.dumps(_WritesAFile(marker), protocol=4))
    _reseal(cdir / "step_000006")
    # step 4: a COMPLETE marker that lists no files.
    (cdir / "step_000004" / ckpt.MARKER).write_text(json.dumps({"step": 4, "files": []}))

    with pytest.raises(UnsafeCheckpoint, match="system"):
        SafeFileSystemReader(cdir / "step_000006").read_metadata()
    messages = []
    assert ckpt.find_checkpoint(run, log=messages.append) == cdir / "step_000002"
    assert len(messages) == 2 and "step_000006" in messages[0] and "system" in messages[0]
    assert "step_000004" in messages[1] and "lists no files" in messages[1]
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir() if p.is_file()}

    # Naming the forged checkpoint directly: one line, exit 2, nothing changed.
    rc = main(["train", "--resume", str(cdir / "step_000006"), "--nproc", "2", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not usable" in err and "system" in err, err
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir() if p.is_file()} == before

    # Resuming the run: both bad checkpoints skipped with a line each, step 2 used, the losses continue exactly.
    assert main(["train", "--resume", str(run), "--nproc", "2", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "lists no files" in err
    assert not marker.exists()  # the forged pickle never ran
    resumed = dict(zip(_rows(run), [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()]))
    assert sorted(resumed) == list(range(1, 7))
    for step in range(3, 7):
        assert resumed[step] == uninterrupted[step], step  # bit-equal: same world, same arithmetic
