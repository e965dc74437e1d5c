"""`LayerProfile.forward_ops`, the unit the host's time is priced by ([Note: host time per op] in
plan/schedule.py): the trace's count per layer against the operators a `TorchDispatchMode` sees
when the same layer runs for real, and the analytic profile's against the trace's."""
from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.cost.device import DEVICES
from shardsched.models.gpt_config import GPTConfig
from shardsched.models.spec import build_gpt
from shardsched.profile.analytic import analytic_profile
from shardsched.profile.trace import trace_profile

CPU = DEVICES["cpu"]


def real_counts(model: torch.nn.Module, inputs: tuple, layers: list[str]) -> dict[str, int]:
    """Operators each named module's forward dispatches when the model runs for real."""
    counts, running = collections.Counter(), []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if running:
                counts[running[-1]] += 1
            return func(*args, **(kwargs or {}))

    for name in layers:
        module = model.get_submodule(name)
        module.register_forward_pre_hook(lambda m, a, name=name: running.append(name))
        module.register_forward_hook(lambda m, a, o: running.pop() and None)  # None: the output stays
    with Count():
        model(*inputs)
    return dict(counts)


@pytest.mark.parametrize("norm,mlp", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_traced_blocks_count_what_runs(norm, mlp):
    torch.manual_seed(0)
    cfg = GPTConfig(layers=6, hidden=32, heads=2, vocab=128, seq=16, norm=norm, mlp=mlp)
    model, inputs = build_gpt(cfg, micro_batch=2, seq=16)
    traced = {layer.name: layer.forward_ops for layer in trace_profile(model, inputs, name="t", device=CPU).layers}
    blocks = [f"blocks.{i}" for i in range(6)]  # 6 >= 5: the repeated-block shortcut stands in for 3, 4
    real = real_counts(model, inputs, blocks)
    assert len(set(real.values())) == 1 and len({traced[b] for b in blocks}) == 1  # the same block six times
    # fake tensors dispatch a few reshapes as views that real ones do not (36 for 32 here)
    assert all(abs(traced[b] / real[b] - 1) <= 0.15 for b in blocks), (traced, real)
    analytic = analytic_profile(cfg, micro_batch=2, seq=16, device=CPU).layers
    assert [layer.forward_ops for layer in analytic] == [traced[layer.name] for layer in analytic]


def test_hf_llama_layers_within_3_percent_and_the_analytic_rotary_block():
    """The trace sees five views more and three detaches less than a real run of HF's Llama layer
    (73 operators); a `gpt:` spec without learned positions stands for it ([Note: operators per
    layer in analytic profiles])."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from shardsched.models.hf_task import as_loss_model
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = as_loss_model(LlamaForCausalLM(config), "causal")
    idx = torch.randint(0, 256, (2, 16))
    traced = {layer.name: layer.forward_ops for layer in trace_profile(model, (idx, idx), name="t", device=CPU).layers}
    layers = ["model.layers.0", "model.layers.1"]
    for name, real in real_counts(model, (idx, idx), layers).items():
        assert abs(traced[name] / real - 1) <= 0.03, (name, traced[name], real)
    gpt = GPTConfig(layers=2, hidden=64, heads=4, vocab=256, seq=16, norm="rmsnorm", mlp="swiglu", bias=False,
                    learned_pos=False)
    assert analytic_profile(gpt, micro_batch=2, seq=16, device=CPU).layers[1].forward_ops == traced[layers[0]]
