"""Refused starts change nothing (issue 29): a size beyond what a plan file holds is refused
before any worker starts; a budget no plan fits or an override that names no layer is refused
by the launching process, which plans before any worker starts ([Note: planned before the
workers start]), and leaves no run directory, or an existing one as it was."""
from __future__ import annotations

import pytest

from shardsched.cost.bytes import MAX_BYTES, parse_bytes
from shardsched.errors import UsageError

from ._util import assert_rejected

TRAIN = ["train", "--model", "gpt:layers=2,hidden=32,heads=2,seq=16", "--seq", "16", "--nproc", "2",
         "--steps", "1", "--quiet"]


@pytest.mark.parametrize("size", ["100000000000000000000000000TiB", "1" + "0" * 400, "8388608TiB"])
def test_sizes_beyond_a_plan_file_are_refused(size):
    with pytest.raises(UsageError, match="is too large; accepted: .* at most 2\\*\\*63-1 bytes"):
        parse_bytes(size)
    assert parse_bytes("8388607TiB") == 8388607 << 40 <= MAX_BYTES  # the largest TiB count that fits


def test_a_huge_budget_is_one_line_before_any_worker(tmp_path, capsys):
    line = assert_rejected([*TRAIN, "--memory-budget", "100000000000000000000000000TiB", "--run-dir",
                            str(tmp_path / "run")], tmp_path, capsys, "is too large")
    assert "worker" not in line


@pytest.mark.parametrize("flags, fragment", [
    (["--memory-budget", "1B"], "no plan fits the memory budget of 1 B"),
    (["--strategy", "full_shard,nomatch.*=replicate"], "'nomatch.*' matches no layer"),
])
@pytest.mark.parametrize("existing", [False, True])
def test_refused_starts_leave_nothing(flags, fragment, existing, tmp_path, capsys, monkeypatch):
    def no_workers(*args, **kwargs):
        raise AssertionError("a worker was started")
    monkeypatch.setattr("shardsched.train.launcher.launch", no_workers)
    run = tmp_path / "runs" / "r"
    if existing:  # an earlier run's log is not appended to
        run.mkdir(parents=True)
        (run / "train.log").write_text("an earlier run\n")
    assert_rejected([*TRAIN, *flags, "--run-dir", str(run)], tmp_path, capsys, fragment)
    assert run.exists() == existing and (tmp_path / "runs").exists() == existing


def _plan_file(tmp_path, capsys) -> dict:
    import json

    from ._util import run_cli
    out = tmp_path / "made.json"
    rc, _, err = run_cli(["plan", "--model", TRAIN[2], "--seq", "16", "--world", "2", "--no-fuse", "--json",
                          "--out", str(out)], capsys)
    assert rc == 0, err
    return json.loads(out.read_text())


def test_a_plan_listing_layers_out_of_order_is_refused_by_train(tmp_path, capsys):
    """`plan --plan` refused it already; `train --plan` ran it (its prefetches and predictions
    assume the listed order): now one line, exit 2, before any worker starts."""
    import json
    plan = _plan_file(tmp_path, capsys)
    units = plan["units"]
    assert [u["name"] for u in units] == ["embed", "blocks.0", "blocks.1", "head"]
    units[1], units[2] = units[2], units[1]
    (tmp_path / "swapped.json").write_text(json.dumps(plan))
    assert_rejected([*TRAIN, "--plan", str(tmp_path / "swapped.json"), "--run-dir", str(tmp_path / "run")],
                    tmp_path, capsys, "lists layer 'blocks.0' after 'blocks.1', out of the order the model runs them")


def test_a_valid_50mb_plan_is_accepted_and_a_larger_than_64mib_one_refused(tmp_path, capsys):
    """Size alone is no fault under the 64 MiB cap (a plan of 100,000 units is ~30 MB): the
    decision documented in design.md; whitespace pads a valid plan to the size."""
    import json

    from shardsched.plan.validate import MAX_PLAN_BYTES

    from ._util import run_cli
    text = json.dumps(_plan_file(tmp_path, capsys))
    for size, rc_want in ((50_000_000, 0), (MAX_PLAN_BYTES + 1, 2)):
        (tmp_path / "big.json").write_text(text + " " * (size - len(text)))
        rc, _, err = run_cli(["plan", "--model", TRAIN[2], "--seq", "16", "--world", "2", "--plan",
                              str(tmp_path / "big.json")], capsys)
        assert rc == rc_want, err
    assert "larger than 64 MiB" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("blob, words", [
    (bytes(range(256)) * 40, "is not UTF-8 text (byte 128 of 10,240)"),
    (b"plain\0text " * 1000, "holds NUL bytes (byte 5 of 11,000), a binary file"),
])
def test_a_data_file_that_is_not_text_trains_and_says_so(blob, words, tmp_path, capsys):
    import json

    from ._util import run_cli
    (tmp_path / "data.bin").write_bytes(blob)
    run = tmp_path / "run"
    rc, _, err = run_cli([*TRAIN, "--steps", "2", "--data", str(tmp_path / "data.bin"), "--run-dir", str(run)],
                         capsys)
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if "data.bin" in ln] == [
        f"note: --data {tmp_path / 'data.bin'} {words}: trained on its raw bytes as tokens, as any file "
        f"(the vocabulary is the 256 byte values)"]
    assert any(words in n for n in json.loads((run / "summary.json").read_text())["notes"])
