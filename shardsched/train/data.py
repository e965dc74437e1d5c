"""Byte-level text data: a corpus, a train/validation split, deterministic batches.

A batch is a function of (seed, step, split) only: offsets come from a
`torch.Generator` seeded with those, and worker r of W takes rows
[r*B/W, (r+1)*B/W) of the global batch of B sequences. So the mathematics of a
step does not depend on the number of workers, and the data position of a run
is its step number (a resumed run continues exactly).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from shardsched.errors import UsageError

DEFAULT_MAX_BYTES = 8 << 20
"""Cap on the default corpus, so every worker reads it in well under a second."""
VAL_FRACTION = 0.05
"""Share of the bytes (at the end) kept for validation."""


@dataclass(frozen=True, kw_only=True)
class TextData:
    """A byte corpus split into training and validation tokens (uint8)."""

    train: torch.Tensor
    """Training bytes, 1-D uint8."""
    val: torch.Tensor
    """Validation bytes (the last VAL_FRACTION of the corpus), 1-D uint8."""
    source: str
    """Where the bytes came from: a path, or "python-stdlib"."""
    note: str = ""
    """What the run says about a --data file that is not text (`not_text_note`), else ""."""


def stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The Python standard library's *.py files, in sorted path order, up to max_bytes.

    Sorted walk order (not os.walk's filesystem order) keeps the corpus the
    same on every worker and every run of one Python installation.
    """
    root = os.path.dirname(os.__file__)
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
    chunks, total = [], 0
    for path in sorted(paths):
        try:
            with open(path, "rb") as f:
                blob = f.read(max_bytes - total)
        except OSError:
            continue  # an unreadable stdlib file is no reason to fail; order stays sorted
        chunks.append(blob)
        total += len(blob)
        if total >= max_bytes:
            break
    return b"".join(chunks)


def read_user_file(path: str) -> bytes:
    """The bytes of --data PATH; UsageError when missing, unreadable or empty."""
    if not os.path.isfile(path):
        raise UsageError(f"--data {path}: no such file")
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise UsageError(f"--data {path}: cannot read ({e.strerror})") from None
    if not blob:
        raise UsageError(f"--data {path}: file is empty")
    return blob


def bytes_needed(*, batch: int, seq: int) -> int:
    """Smallest corpus that holds one global batch for training plus one validation sequence."""
    return batch * (seq + 1) + (seq + 1)


def load_text(path: str | None, *, batch: int, seq: int, max_bytes: int = DEFAULT_MAX_BYTES) -> TextData:
    """Load --data PATH (or the stdlib corpus) and split it; UsageError if too small."""
    blob = read_user_file(path) if path else stdlib_corpus(max_bytes)
    source = path or "python-stdlib"
    need = bytes_needed(batch=batch, seq=seq)
    if len(blob) < need:
        raise UsageError(
            f"data {source} has {len(blob)} bytes; need at least {need} "
            f"(batch {batch} x (seq {seq} + 1) for training, plus {seq + 1} for validation)")
    tokens = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    n_val = max(seq + 1, int(len(blob) * VAL_FRACTION))
    # Keep at least one global batch of training bytes even when the file is small.
    n_val = min(n_val, len(blob) - batch * (seq + 1))
    return TextData(train=tokens[:-n_val], val=tokens[-n_val:], source=source,
                    note=not_text_note(blob, source) if path else "")


def not_text_note(blob: bytes, source: str) -> str:
    """A --data file that is not UTF-8 text (a binary, Latin-1) trains all the same: the model's
    tokens are bytes, so any file is a corpus. Said once, so a wrong path is noticed; "" for text."""
    import codecs
    decoder, chunk = codecs.getincrementaldecoder("utf-8")(), 16 << 20  # no whole-file str copy
    for i in range(0, len(blob), chunk):
        try:
            decoder.decode(blob[i:i + chunk], final=i + chunk >= len(blob))
        except UnicodeDecodeError as e:
            return (f"--data {source} is not UTF-8 text (byte {i + e.start:,} of {len(blob):,}): trained on its "
                    f"raw bytes as tokens, as any file (the vocabulary is the 256 byte values)")
    nul = blob.find(b"\0")
    if nul >= 0:
        return (f"--data {source} holds NUL bytes (byte {nul:,} of {len(blob):,}), a binary file: trained on "
                f"its raw bytes as tokens, as any file (the vocabulary is the 256 byte values)")
    return ""


def check_divisible(*, batch: int, world: int) -> None:
    """Every worker takes the same number of rows, or the mean gradient would be wrong."""
    if batch < 1 or batch % world:
        raise UsageError(f"--batch {batch} must be a positive multiple of the number of workers ({world})")


def _generator(seed: int, step: int, salt: int) -> torch.Generator:
    # One generator per (seed, step, split): no hidden state to save or restore.
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + step) * 4 + salt)
    return g


def get_batch(tokens: torch.Tensor, *, seed: int, step: int, batch: int, seq: int,
              rank: int = 0, world: int = 1, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """This worker's rows of global batch `step`: (inputs, targets), int64 of shape (batch/world, seq).

    `salt` separates streams that share a seed (0 training, 1 validation).
    """
    check_divisible(batch=batch, world=world)
    offsets = torch.randint(0, len(tokens) - seq, (batch,), generator=_generator(seed, step, salt))
    rows = batch // world
    mine = offsets[rank * rows:(rank + 1) * rows]
    window = torch.stack([tokens[o:o + seq + 1] for o in mine.tolist()]).long()
    # contiguous: models call .view on their inputs (T5 does), which a slice refuses
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()
