"""A worker that dies stops the whole run quickly, with a message naming it."""
import time

import pytest

from shardsched.cli import main

from ._helpers import TINY


@pytest.mark.parametrize("mode, message", [
    ("raise", "worker 1 failed: RuntimeError: test failure injected at step 2"),
    ("kill", "worker 1 was killed by SIGKILL"),
])
def test_worker_death_stops_the_run(mode, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_RANK", "1")
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_STEP", "2")
    monkeypatch.setenv("SHARDSCHED_TEST_FAIL_MODE", mode)
    rc = main(["train", "--nproc", "2", "--steps", "50", "--model", TINY, "--seq", "16",
               "--run-dir", str(tmp_path), "--quiet"])
    # From the last step written (just before the death at step 2) to the parent's return:
    # far below the 180 s collective timeout, the parent stopped the others (start-up excluded:
    # it depends on the machine's load, not on failure handling).
    elapsed = time.time() - (tmp_path / "metrics.jsonl").stat().st_mtime
    err = capsys.readouterr().err
    assert rc == 1
    assert message in err and "Traceback" not in err
    assert elapsed < 5, elapsed
    steps = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(steps) == 1  # step 1 finished, step 2 never did


def test_a_multi_line_error_is_named_by_its_first_line():
    from shardsched.train.supervise import _last_line
    tb = ("Traceback (most recent call last):\n  File \"w.py\", line 3, in step\n    loss.backward()\n"
          "torch.utils.checkpoint.CheckpointError: A different number of tensors was saved\n"
          "Number of tensors saved during forward: 21\n\nworkaround examples.\n")
    assert _last_line(tb) == "torch.utils.checkpoint.CheckpointError: A different number of tensors was saved"
    assert _last_line("shardsched.errors.UsageError: bad flag") == "shardsched.errors.UsageError: bad flag"
    assert _last_line("") == "unknown error"
