"""Traced profiles (fake tensors): equal to the analytic GPT profile, deterministic, and the
repeated-block shortcut equal to a full trace."""
import torch

import shardsched.profile.trace as trace
from shardsched.cost.device import DEVICES
from shardsched.models.gpt_config import GPTConfig
from shardsched.models.spec import build_gpt
from shardsched.profile.analytic import analytic_profile

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
    monkeypatch.setattr(trace, "_MIN_STACK", 100)  # trace every block
    assert trace.trace_profile(model, inputs, name="t", device=CPU) == short
