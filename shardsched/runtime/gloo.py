"""FSDP2's collectives on gloo, held to the memory the plan was verified with.

[Note: gloo's lagging buffers]
ProcessGroupGloo runs a collective on one of its worker threads. The thread marks the work
complete, which lets `wait()` return, and only then takes its queue lock again to drop its
own reference to the work (`ProcessGroupGloo::runLoop`: `workInProgress_[i].reset()` after
`AsyncWork::execute`), and the work holds the collective's tensors. An AllGather's output is
a unit's whole flat parameters: FSDP2 copies them out and drops the buffer, but if the gloo
thread still holds it, it stays allocated while the step runs on. Measured on 2 gloo ranks,
2000 AllGathers each: 5-19% still had that extra holder right after `wait()`; once in CI it
put one worker of four 1.06 MB (5.0%) above the verified peak of an LSTM plan (an outside
check saw a ConvNeXt worker 2.6 MiB over its budget). The verification (fake process group)
and NCCL (stream-ordered frees) have no such window.

`SettledAllGather` closes it: its work's `wait()` returns only once the output's storage has
no holder beyond those it had before the collective was issued, yielding the CPU (and the
GIL the freeing thread may need) until then, a bounded number of times. FSDP2 takes it
through `FSDPModule.set_custom_all_gather`; everything else about the collective is FSDP2's
own (`dist.all_gather_single`, async as FSDP2 asks). ReduceScatters on gloo were measured
without the window (0 of 2000).

[Note: gloo's reduce-scatter copies]
ProcessGroupGloo's reduce-scatter copies its whole input and output while it runs (a 1,152,000 B
input at world 4 allocated 1,440,040 B more), which NCCL (in place on FSDP2's buffers) and the
fake process group of the verification do not. At a unit's post-backward that copy comes on top
of the reduce-scatter buffer the memory model counts: a two-tower model whose text embedding
reduce-scatters as the vision tower's backward runs ([Note: a unit whose inputs need no
gradient] in runtime/own_backward.py) ran 8.5% above its verified peak on every gloo worker. So
on gloo a reduce-scatter of at least `LARGE` bytes runs on `PIECES` column slices of its (world, n)
input one after the other, each with FSDP2's own collective (`dist.reduce_scatter_single`): the
copies are then about 2/PIECES of the unit's gradients (the slice's own copy, and gloo's), and
that run matched its verified peak to the byte. Smaller ones run whole: each piece is a gloo
collective more, and a unit under 1 MiB copies less than that. Every element is reduced once.
"""
from __future__ import annotations

import time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

SPINS = 100_000
"""Most yields `SettledWork.wait` spends waiting for gloo's thread (a work bound, not a clock:
about a second when nothing else runs; a holder that never lets go only costs this)."""


def _holders(t: torch.Tensor) -> int:
    """References to `t`'s storage (tensors and views over it, a collective's work)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class SettledWork(dist.Work):
    """A gloo AllGather's work whose `wait()` also waits for gloo's thread to let go of the output."""

    def __init__(self, work: dist.Work, output: torch.Tensor, holders: int):
        super().__init__()
        self._work, self._output, self._holders = work, output, holders

    def wait(self, timeout=None) -> bool:
        if self._work is not None:
            self._work.wait()
            self._work = None  # our own reference to the work (and through it, the output)
        spins = 0
        while _holders(self._output) > self._holders and spins < SPINS:
            time.sleep(0)
            spins += 1
        return True

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()


class SettledAllGather(DefaultAllGather):
    """FSDP2's default AllGather (its buffer allocation, `dist.all_gather_single`), settled."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        holders = _holders(output_tensor)
        work = SettledWork(dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True),
                           output_tensor, holders)
        if async_op:
            return work
        work.wait()
        return None


PIECES = 16
"""A large gloo ReduceScatter runs in this many column pieces ([Note: gloo's reduce-scatter copies])."""
LARGE = 1 << 20
"""Bytes of ReduceScatter input from which it is split: each piece is one more gloo collective
(4 ranks on 2 cores: 16 pieces for every unit took a 20-step parity test from 11 s to 34 s)."""


class PiecewiseReduceScatter(DefaultReduceScatter):
    """FSDP2's default ReduceScatter (its buffers, `dist.reduce_scatter_single`), from `LARGE`
    bytes on `PIECES` column slices of the (world, n) input, one after another ([Note: gloo's
    reduce-scatter copies])."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op, async_op: bool = False) -> None:
        n = output_tensor.numel()
        rows = input_tensor.view(dist.get_world_size(group), n)  # rank r's shard is column block r
        pieces = PIECES if input_tensor.numel() * input_tensor.element_size() >= LARGE else 1
        step = -(-n // pieces)
        for a in range(0, n, step):
            piece = rows[:, a:a + step].contiguous().view(-1)  # (world, step) -> each rank's slice of it
            dist.reduce_scatter_single(output=output_tensor[a:a + step], input=piece, group=group, op=op)
        return None  # done: FSDP2 asks for it synchronously (`foreach_reduce`)


def settle_gloo_all_gathers(model: nn.Module, group: dist.ProcessGroup) -> None:
    """On a gloo group, every FSDP2 module of `model` gathers with `SettledAllGather` and
    reduce-scatters with `PiecewiseReduceScatter`."""
    if dist.get_backend(group) != "gloo":
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(SettledAllGather())
            module.set_custom_reduce_scatter(PiecewiseReduceScatter())
