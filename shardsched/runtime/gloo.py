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
own (`dist.all_gather_single`, async as FSDP2 asks). A reduce-scatter's buffers were measured
without the window (0 of 2000), but not gloo's own clone of its input (next note).

[Note: gloo's reduce-scatter copies]
ProcessGroupGloo has no reduce-scatter of its own: `reduce_scatter_tensor_coalesced` clones the
whole (world, n) input, all-reduces the clone on a worker thread, and copies this rank's row
into the output when waited. NCCL reduces in place on FSDP2's buffers and the fake process
group of the verification allocates nothing, so on gloo the clone came on top of what the
plan was verified with: a two-tower model's 1.1 MiB text embedding put every worker 8.5% above
its verified peak. Worse, the clone is gloo's, out of reach: the all-reduce's work holds it
until the worker thread lets go of that work ([Note: gloo's lagging buffers]), so under load
one worker in four now and then still held a 437 KiB clone into the next unit's backward
(+6.9% in CI, the other workers exact). So on gloo `SettledReduceScatter` does the same thing
in the open: `dist.all_reduce` in place on FSDP2's own reduce-scatter input (FSDP2 only keeps
that buffer alive after the collective, never reads it), settled as an AllGather's output is,
then this rank's row is copied into the output. The same reduction, no clone, nothing lagging.
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
    """A gloo collective's work whose `wait()` also waits for gloo's thread to let go of `output`
    (an AllGather's output, the tensor an all-reduce reduced in place)."""

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


class SettledReduceScatter(DefaultReduceScatter):
    """FSDP2's default ReduceScatter buffers; on gloo the (world, n) input is all-reduced in
    place and settled, and this rank's row is the output ([Note: gloo's reduce-scatter copies])."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op, async_op: bool = False) -> None:
        holders = _holders(input_tensor)
        SettledWork(dist.all_reduce(input_tensor, op=op, group=group, async_op=True), input_tensor, holders).wait()
        rows = input_tensor.view(dist.get_world_size(group), -1)  # rank r's shard is row r
        output_tensor.copy_(rows[dist.get_rank(group)])
        return None  # done: FSDP2 asks for it synchronously (`foreach_reduce`)


def settle_gloo_all_gathers(model: nn.Module, group: dist.ProcessGroup) -> None:
    """On a gloo group, every FSDP2 module of `model` gathers with `SettledAllGather` and
    reduce-scatters with `SettledReduceScatter`."""
    if dist.get_backend(group) != "gloo":
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(SettledAllGather())
            module.set_custom_reduce_scatter(SettledReduceScatter())
