"""Traced profiles (fake tensors): equal to the analytic GPT profile, deterministic, and the
repeated-block shortcut equal to a full trace."""
import dataclasses

import pytest
import torch

import shardsched.profile.trace as trace
import shardsched.profile.trace_stacks as trace_stacks
from shardsched.cost.device import DEVICES
from shardsched.models.gpt_config import GPTConfig
from shardsched.models.spec import build_gpt
from shardsched.profile.analytic import analytic_profile
from shardsched.profile.measure import measure_profile

CPU = DEVICES["cpu"]


def test_traced_equals_analytic_bytes_and_params():
    torch.set_num_threads(1)
    cfg = GPTConfig(layers=2, hidden=64, heads=2, vocab=256, seq=32, mlp="swiglu", norm="rmsnorm", bias=False)
    model, inputs = build_gpt(cfg, micro_batch=2, seq=32)
    traced = trace.trace_profile(model, inputs, name="t", device=CPU)
    analytic = analytic_profile(cfg, micro_batch=2, seq=32, device=CPU, compute_dtype="float32")
    assert traced.fingerprint == analytic.fingerprint and traced.input_bytes == analytic.input_bytes
    for t, a in zip(traced.layers, analytic.layers, strict=True):
        assert (t.name, t.params, t.dims, t.activation_bytes) == (a.name, a.params, a.dims, a.activation_bytes)
        assert [(c.name, c.params, c.activation_bytes) for c in t.children] == \
            [(c.name, c.params, c.activation_bytes) for c in a.children]
        # what selective checkpointing keeps (core/sac_policy.py): `+sac` attention and every other
        # matmul's outputs (the block's mm counter), `+sac-all` every matmul's
        assert [x.selective_saved_bytes for x in (t, *t.children)] == [x.selective_saved_bytes for x in (a, *a.children)]
        assert [x.selective_all[0] for x in (t, *t.children)] == [x.selective_all[0] for x in (a, *a.children)]
    block, T, h, f = traced.layers[1], 2 * 32, 64, cfg.ffn_size  # +sac drops the out projection's and up's outputs
    assert block.selective_all[0] - block.selective_saved_bytes == 4 * T * (h + f)
    assert block.selective_recompute_seconds > block.selective_all[3]
    block = traced.layers[1]  # matmul FLOPs: 2 per weight per token forward, twice that backward
    weights = sum(n for d0, n in block.dims if d0 != n)
    assert block.forward_flops["matmul"] == 2 * weights * 64
    assert block.backward_flops["matmul"] == 4 * weights * 64


def test_same_inputs_same_profile_and_repeated_blocks_shortcut(monkeypatch):
    torch.set_num_threads(1)
    cfg = GPTConfig(layers=6, hidden=32, heads=2, vocab=128, seq=16)
    model, inputs = build_gpt(cfg, micro_batch=1, seq=16)
    short = trace.trace_profile(model, inputs, name="t", device=CPU)
    assert trace.trace_profile(model, inputs, name="t", device=CPU) == short
    monkeypatch.setattr(trace_stacks, "_MIN_STACK", 100)  # trace every block
    assert trace.trace_profile(model, inputs, name="t", device=CPU) == short


def test_a_trace_does_not_depend_on_what_the_process_traced_before():
    """[Note: a cold fake-tensor cache]: an LSTM's backward workspace was 1 KiB larger on every
    trace after a process's first (FakeTensorMode's process-wide op cache)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Lstm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(100, 64), torch.nn.Linear(64, 100)
            self.rnn = torch.nn.LSTM(64, 64, num_layers=3, batch_first=True)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.head(self.rnn(self.embed(x))[0]).flatten(0, 1), y.flatten())

    torch.manual_seed(0)
    model, inputs = Lstm(), (torch.randint(0, 100, (4, 16)), torch.randint(0, 100, (4, 16)))
    FakeTensorMode.cache_clear()  # as in a fresh process
    first = trace.trace_profile(model, inputs, name="t", device=CPU)
    assert [trace.trace_profile(model, inputs, name="t", device=CPU) for _ in range(2)] == [first, first]


@pytest.mark.parametrize("cfg, dtype, head_exact", [
    # activation-heavy blocks: the peak is in the MLP's first backward ops
    (GPTConfig(layers=2, hidden=64, heads=2, vocab=256, seq=32, mlp="swiglu", norm="rmsnorm", bias=False),
     "float32", True),
    (GPTConfig(layers=2, hidden=64, heads=2, vocab=256, seq=32), "bfloat16", True),
    # parameter-heavy blocks: the peak is late, every weight gradient live
    (GPTConfig(layers=2, hidden=128, heads=2, vocab=512, seq=32), "float32", False)])
def test_traced_workspace_equals_measured_and_analytic(cfg, dtype, head_exact):
    """The backward workspace (`profile.workspace`): traced on fake tensors == measured on
    real ones (to 1 KiB: small fp32 statistics) == the analytic closed form (blocks to
    512 bytes; the head only where its cross-entropy gradients dominate)."""
    torch.set_num_threads(1)
    model, inputs = build_gpt(cfg, micro_batch=2, seq=32)
    traced = trace.trace_profile(model, inputs, name="t", device=CPU, compute_dtype=dtype)
    measured = measure_profile(model, inputs, name="t", repeats=1, warmup=0, compute_dtype=dtype)
    analytic = analytic_profile(cfg, micro_batch=2, seq=32, device=CPU, compute_dtype=dtype)
    for t, m, a in zip(traced.layers, measured.layers, analytic.layers, strict=True):
        assert t.workspace_bytes > 0 and abs(t.workspace_bytes - m.workspace_bytes) <= 1024, t.name
        if t.name != "head":
            assert abs(t.workspace_bytes - a.workspace_bytes) <= 512, t.name
        elif head_exact:
            assert t.workspace_bytes == a.workspace_bytes


def test_a_trace_does_not_depend_on_when_the_garbage_collector_runs():
    """Reference cycles that held autograd nodes (FlopCounterMode's module tracker, a multi-grad
    hook) kept a checkpointed region's saved tensors alive until `gc` ran: a GPT-2 under HF's
    gradient checkpointing traced workspaces 30-140% apart with the collector off and on."""
    import gc

    from tests.train.user_models import gpt2_tied

    def traced():
        model, inputs, _ = gpt2_tied()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return trace.trace_profile(model, inputs, name="gpt2", device=CPU)
    on = traced()
    gc.collect()
    gc.disable()
    try:
        off = traced()
    finally:
        gc.enable()
    assert on == off
    blocks = [layer for layer in on.layers if layer.name.startswith("transformer.h.")]
    assert blocks[0].workspace_bytes == blocks[1].workspace_bytes  # two equal blocks, one window


@pytest.mark.parametrize("build", ["build_vit", "build_unet_mse", "build_self_ckpt"])
def test_a_trace_on_real_tensors_records_what_the_fake_one_does(build):
    """[Note: a trace on real tensors]: the fallback for models that read values runs the same
    hooks and counts on real copies; on a model both can run, every byte field is the same."""
    from tests.verify import user_models as um
    model, inputs = getattr(um, build)()
    fake = trace.trace_profile(model, inputs, name="m", device=DEVICES["cpu"])
    real = trace.trace_profile(model, inputs, name="m", device=DEVICES["cpu"], tensors="real")
    assert [l.name for l in fake.layers] == [l.name for l in real.layers]
    for f, r in zip(fake.layers, real.layers):
        for field in dataclasses.fields(f):
            if "seconds" not in field.name:
                a, b = getattr(f, field.name), getattr(r, field.name)
                if field.name == "selective_all":  # (saved, outside input, forward bytes, seconds)
                    a, b = a[:3], b[:3]
                assert a == b, (f.name, field.name, a, b)


def test_no_storage_takes_a_dead_ones_key_while_a_trace_runs():
    """[Note: storage keys]: the allocator gives a dead storage's address to the next one (here
    within 50 fake allocations); inside `pinned_storage_keys` every key names one storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from shardsched.profile.trace_record import pinned_storage_keys, storage_key

    def keys():
        first = torch.empty(64)
        k = storage_key(first)
        del first
        return [k, *(storage_key(torch.empty(64)) for _ in range(50))]
    with FakeTensorMode():
        assert len(set(keys())) < 51  # unpinned: addresses come back
        with pinned_storage_keys():
            assert len(set(keys())) == 51
