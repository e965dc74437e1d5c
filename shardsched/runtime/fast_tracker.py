"""PyTorch's memory trackers, updating only the modules that are running.

[Note: the tracker's per-op cost]
After every op, `MemTracker._update_peak_stats` walks every module it has ever seen
(`memory_tracking`, a weak dictionary: one weak reference dereferenced per module) and
updates those that are running (`_mod_tracker.parents`, the fully qualified names of the
module stack). With a few hundred modules that walk was 60% of a verification (py-spy on the
README's `tradeoff --model llama-7b --world 64`: 43 of its 70 s of verification). The subclasses here visit the
running modules only, through an index from name to stats rebuilt whenever a module is added
or collected: the same updates, so the same peaks and snapshots
(`tests/runtime/test_fast_tracker.py` compares them with the stock trackers').

[Note: inputs walked, not rebuilt]
Both trackers count a module's inputs and outputs with `tree_map_only(torch.Tensor, f, args)`
where `f` returns None, so pytree rebuilds every container around None leaves. A namedtuple
whose constructor checks its fields cannot be rebuilt so: an `nn.GRU` fed a `PackedSequence`
(`pack_padded_sequence`) raised "Expected data to be a list or tuple of length 2" in
MemTracker's pre-forward hook, and a DDP plan of such a model was refused as failing its step.
The subclasses walk the leaves (`tree_leaves`) and count the same storages.
"""
from __future__ import annotations

from copy import deepcopy

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._pytree import tree_leaves

_TOTAL = "Total"


class _RunningModulesOnly:
    """See [Note: the tracker's per-op cost]; mixed in before the tracker class."""

    _indexed = -1
    """How many modules `_by_fqn` indexes: rebuilt when the tracker has seen more (or fewer)."""

    def _running_stats(self):
        if len(self.memory_tracking) != self._indexed:
            self._by_fqn = {}
            for stats in self.memory_tracking.values():
                self._by_fqn.setdefault(stats.mod_fqn, []).append(stats)
            self._indexed = len(self.memory_tracking)
        for fqn in self._mod_tracker.parents:
            yield from self._by_fqn.get(fqn, ())

    def _update_peak_stats(self, peak_state) -> None:
        # The body of MemTracker._update_peak_stats (torch 2.13), over the running modules.
        snap = self._curr_mem_snap
        for stats in self._running_stats():
            if peak_state in stats.snapshots:
                for dev, dev_snap in snap.items():
                    if stats.local_peak.get(dev, 0) < dev_snap[_TOTAL]:
                        stats.local_peak[dev] = dev_snap[_TOTAL]
                        stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
        for dev, dev_snap in snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL]:
                self._peak_mem[dev] = dev_snap[_TOTAL]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)

    def _track_inputs_or_outputs(self, args) -> int:
        # MemTracker's, over the leaves: [Note: inputs walked, not rebuilt].
        total = 0
        for t in _tensors(args):
            for st in get_untyped_storages(t):
                winfo, _ = self._WINFO.get(st, (None, None))
                if winfo is not None:
                    total += winfo.mem_consumed
        return total


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class FastFSDPMemTracker(_RunningModulesOnly, FSDPMemTracker):
    """FSDPMemTracker, [Note: the tracker's per-op cost]."""

    def track_inputs(self, inputs: tuple) -> None:
        # FSDPMemTracker's, over the leaves: [Note: inputs walked, not rebuilt].
        for t in _tensors(inputs):
            self._update_and_maybe_create_winfos(t, _FSDPRefType.INP)


class FastMemTracker(_RunningModulesOnly, MemTracker):
    """MemTracker, [Note: the tracker's per-op cost]."""
