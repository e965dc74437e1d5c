"""`+sac` is torchtitan's op policy (torchtitan/distributed/activation_checkpoint.py,
`_custom_policy` and its mm counter): every second mm/linear of a checkpointed call is
recomputed; `+sac-all` keeps every matmul (issue 28)."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from shardsched.core.types import Checkpoint
from shardsched.core import sac_policy


aten = torch.ops.aten


def test_every_second_mm_is_recomputed_under_sac_and_kept_under_sac_all():
    ops = [aten.mm.default] * 7  # a Llama block: q, k, v, o, gate, up, down
    op = sac_policy.Policy(Checkpoint.SELECTIVE)
    assert [op.saves(f) for f in ops] == [True, False, True, False, True, False, True]
    every = sac_policy.Policy(Checkpoint.SELECTIVE_ALL)
    assert all(every.saves(f) for f in ops)
    op.reset()  # a new call: the counter starts again
    assert op.saves(aten.mm.default)
    # addmm and bmm are saved and not counted; attention is saved; memory-bound ops are not
    assert [op.saves(f) for f in (aten.addmm.default, aten.bmm.default, aten.mm.default)] == [True, True, False]
    assert op.saves(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert not op.saves(aten.mul.Tensor) and not op.saves(aten.silu.default)


class _Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(h, h, bias=False) for _ in range(3))

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _recomputed_mms(mode):
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(4, 16, requires_grad=True)
    seen = []

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.mm.default and torch.is_grad_enabled():
                seen.append(args[1].shape)
            return func(*args, **(kwargs or {}))

    out = checkpoint(block, x, use_reentrant=False, context_fn=lambda: sac_policy.selective_contexts(mode))
    with Count():
        out.sum().backward()
    return len(seen)  # forward mms run again in backward (recomputation runs with grad enabled)


def test_the_runtime_recomputes_what_the_policy_says():
    """Three linears per call: `+sac` recomputes the second (its counter restarts per call and
    counts recomputation apart), `+sac-all` none."""
    assert _recomputed_mms(Checkpoint.SELECTIVE) == 1
    assert _recomputed_mms(Checkpoint.SELECTIVE_ALL) == 0


def test_bf16_mixed_sac_trains_on_this_torch(tmp_path):
    """torch 2.13 refused bf16-mixed `+sac` in backward ("profiler._record_function_enter_new ...
    not found in storage", pytorch/pytorch#182580: FSDP2 casts inputs again in recomputation,
    inside a `record_function` range); `core.sac_policy` has SAC ignore profiler ranges."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "shardsched", "train", "--model", "tiny", "--nproc", "1", "--steps", "2",
                        "--precision", "bf16-mixed", "--strategy", "full_shard+sac", "--seq", "32"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not found in storage" not in r.stdout + r.stderr


def test_saved_ops_cover_torchs_compute_intensive_list_without_importing_it():
    """SAVED names torch's list itself (its module pulls in dynamo and inductor, 2.7 s of
    every `plan`): it must still cover it, and importing the policy must not load it."""
    import subprocess
    import sys

    from shardsched.core.sac_policy import NOT_SAVED, SAVED, torch_compute_intensive
    assert torch_compute_intensive() and torch_compute_intensive() - NOT_SAVED <= SAVED and not NOT_SAVED & SAVED
    code = "import sys, shardsched.profile.trace; print('torch._functorch.partitioners' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "False", r.stderr
