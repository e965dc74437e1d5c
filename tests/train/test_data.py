import pytest
import torch

from shardsched.errors import UsageError
from shardsched.train.data import bytes_needed, get_batch, load_text, stdlib_corpus


def test_stdlib_corpus_is_deterministic_and_capped():
    a, b = stdlib_corpus(200_000), stdlib_corpus(200_000)
    assert a == b and len(a) == 200_000
    assert b"def " in a  # it is Python source


def test_split_and_sizes():
    data = load_text(None, batch=8, seq=128, max_bytes=1_000_000)
    assert len(data.train) + len(data.val) == 1_000_000
    assert len(data.val) == 50_000 and data.train.dtype == torch.uint8


def test_batches_are_deterministic_and_split_across_workers():
    tokens = load_text(None, batch=8, seq=16, max_bytes=100_000).train
    x, y = get_batch(tokens, seed=1, step=5, batch=8, seq=16)
    again, _ = get_batch(tokens, seed=1, step=5, batch=8, seq=16)
    other, _ = get_batch(tokens, seed=1, step=6, batch=8, seq=16)
    assert torch.equal(x, again) and not torch.equal(x, other)
    assert x.shape == (8, 16) and torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    for world in (2, 4):
        rows = [get_batch(tokens, seed=1, step=5, batch=8, seq=16, rank=r, world=world) for r in range(world)]
        assert torch.equal(torch.cat([r[0] for r in rows]), x)
        assert torch.equal(torch.cat([r[1] for r in rows]), y)


def test_batch_must_divide_evenly():
    tokens = torch.zeros(1000, dtype=torch.uint8)
    with pytest.raises(UsageError, match="multiple of the number of workers"):
        get_batch(tokens, seed=0, step=0, batch=6, seq=16, rank=0, world=4)


def test_user_file_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_text(str(tmp_path / "missing.txt"), batch=8, seq=16)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(UsageError, match="empty"):
        load_text(str(empty), batch=8, seq=16)
    small = tmp_path / "small.txt"
    need = bytes_needed(batch=8, seq=16)
    assert need == 8 * 17 + 17
    small.write_bytes(b"x" * (need - 1))
    with pytest.raises(UsageError, match=f"has {need - 1} bytes; need at least {need}"):
        load_text(str(small), batch=8, seq=16)
    small.write_bytes(b"ab" * need)
    data = load_text(str(small), batch=8, seq=16)
    assert len(data.train) >= 8 * 17 and len(data.val) >= 17
