"""[Note: the tracker's per-op cost] in runtime/fast_tracker.py: the trackers that visit only
the running modules measure exactly what PyTorch's own trackers measure, the peak, its kinds
and the module where it happened, on FSDP2 plans and on a plan verified as DDP."""
from __future__ import annotations

import pytest

import shardsched.runtime.memtrack as memtrack
from shardsched.api import plan_model
from shardsched.runtime.fast_tracker import FastFSDPMemTracker, FastMemTracker
from shardsched.verify.engine import verify_plan
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from ..verify import user_models as um

CASES = [(um.build_lstm, "full_shard"), (um.build_vit, "replicate"), (um.build_gru, "full_shard+sac"),
         (um.build_shared, "shard_grad_op+ckpt")]


@pytest.mark.parametrize("build,strategy", CASES, ids=[f"{b.__name__}-{s}" for b, s in CASES])
def test_running_modules_only_measure_what_the_stock_trackers_measure(build, strategy, monkeypatch):
    model, inputs = build()
    plan = plan_model(model, inputs, world=4, strategy=strategy, verify=False)
    fast = verify_plan(model, inputs, plan)
    monkeypatch.setattr(memtrack, "FastFSDPMemTracker", FSDPMemTracker)
    monkeypatch.setattr(memtrack, "FastMemTracker", MemTracker)
    stock = verify_plan(model, inputs, plan)
    assert (fast.peak_bytes, fast.memory, fast.peak_at) == (stock.peak_bytes, stock.memory, stock.peak_at)
    assert fast.peak_at.startswith(("forward of", "backward of", "outside every module"))
    assert issubclass(FastFSDPMemTracker, FSDPMemTracker) and issubclass(FastMemTracker, MemTracker)


@pytest.mark.parametrize("strategy", ["replicate", "full_shard"])
def test_a_packed_sequence_input_is_counted_not_rebuilt(strategy):
    """[Note: inputs walked, not rebuilt]: a GRU fed a PackedSequence made MemTracker's pre-forward
    hook raise, so a DDP plan of it was refused as failing its step. Now it verifies (on real
    tensors: packing reads the lengths) at its prediction."""
    model, inputs = um.build_packed_gru()
    plan = plan_model(model, inputs, world=4, strategy=strategy)
    assert plan.verified is not None and plan.verified.tensors == "real"
    assert abs(plan.verified.peak_bytes / plan.predicted.peak_bytes - 1) <= 0.03, (plan.verified, plan.predicted)
