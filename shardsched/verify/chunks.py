"""FSDP2's parameter chunking, one chunk at a time, while a plan is verified.

[Note: chunks read one at a time]
FSDP2 shards a parameter by `torch.chunk`ing it into one view per rank and keeping its own
(`_fsdp_param.py`: `chunks = _chunk_with_empty(param, world, dim); chunks[shard_rank]`). On
fake tensors every view is a dispatched op: Llama-2-70B at world 512 made 577,000 views
(43 of its 87 CPU seconds) to keep one each. While verifying, `_chunk_with_empty` returns a
list that makes the view it is asked for, by the same rule as `torch.chunk` (chunks of
ceil(n / world) rows, the last ones shorter or empty); what FSDP2 reads of it is the same.
"""
from __future__ import annotations

import contextlib
import math

import torch


class _Chunks:
    """`list(torch.chunk(t, n, dim))` padded with empty tensors to n, made on demand."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.n, self.dim = tensor, num_chunks, dim
        self.size = math.ceil(tensor.size(dim) / num_chunks) if tensor.size(dim) else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.size
        if self.size == 0 or start >= self.tensor.size(self.dim):
            return self[0].new_empty(0) if i else self.tensor.new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.size, self.tensor.size(self.dim) - start))

    def __iter__(self):
        return (self[i] for i in range(self.n))


@contextlib.contextmanager
def chunks_on_demand():
    """See [Note: chunks read one at a time]; FSDP2's own function is back afterwards."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = _Chunks
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original
