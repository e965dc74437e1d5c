"""Choosing the checkpoint to resume from: complete, verified, newest."""
import json
import pickle

import pytest
from torch.distributed.checkpoint.metadata import Metadata

from shardsched.errors import UsageError
from shardsched.train import checkpoint as ckpt


def fake(run_dir, step: int, *, marker: bool = True):
    """A checkpoint directory with two data files, as save_checkpoint leaves it."""
    d = ckpt.checkpoint_dir(run_dir) / f"step_{step:06d}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * (step + 1))
    (d / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    (d / "meta.json").write_text(json.dumps({"step": step, "rng": [step % 256] * 8}))
    if marker:
        (d / ckpt.MARKER).write_text(json.dumps({"step": step, "files": ckpt._manifest(d)}))
    return d


def test_newest_complete_checkpoint_is_used(tmp_path):
    fake(tmp_path, 10)
    newest = fake(tmp_path, 20)
    (ckpt.checkpoint_dir(tmp_path) / "step_000030.tmp").mkdir()  # a save that never finished
    assert ckpt.find_checkpoint(tmp_path, log=pytest.fail) == newest


@pytest.mark.parametrize("damage, why", [
    ("truncate", "truncated"),
    ("marker", "no COMPLETE marker"),
    ("flip", "fails its checksum"),
    ("remove", "is missing"),
])
def test_damaged_checkpoint_is_skipped_with_a_message(tmp_path, damage, why):
    good = fake(tmp_path, 10)
    bad = fake(tmp_path, 20)
    data = bad / "__0_0.distcp"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "marker":
        (bad / ckpt.MARKER).unlink()
    elif damage == "flip":
        blob = bytearray(data.read_bytes())
        blob[7] ^= 1
        data.write_bytes(bytes(blob))
    else:
        data.unlink()
    messages = []
    assert ckpt.find_checkpoint(tmp_path, log=messages.append) == good
    assert len(messages) == 1 and "step_000020" in messages[0] and why in messages[0]


def test_no_usable_checkpoint(tmp_path):
    with pytest.raises(UsageError, match="no usable checkpoint in"):
        ckpt.find_checkpoint(tmp_path, log=lambda m: None)
    bad = fake(tmp_path, 10, marker=False)
    with pytest.raises(UsageError, match="no usable checkpoint in"):
        ckpt.find_checkpoint(tmp_path, log=lambda m: None)
    with pytest.raises(UsageError, match="not usable: no COMPLETE marker"):
        ckpt.find_checkpoint(bad)


def test_a_checkpoint_directory_can_be_named_directly(tmp_path):
    first = fake(tmp_path, 10)
    fake(tmp_path, 20)
    assert ckpt.find_checkpoint(first) == first


def test_publish_never_replaces_a_good_checkpoint(tmp_path):
    good = fake(tmp_path, 10)
    before = (good / "__0_0.distcp").read_bytes()
    tmp = fake(tmp_path / "other", 10)
    (tmp / "__0_0.distcp").write_bytes(b"new")
    ckpt._publish(tmp, good)
    assert (good / "__0_0.distcp").read_bytes() == before and not tmp.exists()


def test_publish_moves_a_broken_checkpoint_aside(tmp_path):
    broken = fake(tmp_path, 10)
    (broken / ckpt.MARKER).unlink()
    new = fake(tmp_path / "other", 10)
    ckpt._publish(new, broken)
    assert ckpt.verify(broken) is None
    assert (broken.parent / "step_000010.broken").is_dir()
