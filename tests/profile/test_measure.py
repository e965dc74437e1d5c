"""measure_profile: layer discovery, parameter ownership, saved-activation accounting, timing."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

from shardsched.errors import UsageError
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.measure import measure_profile, resolve_layers
from shardsched.models.spec import PRESETS, build_gpt, parse_model_spec
from shardsched.profile.types import Profile

torch.set_num_threads(1)


def _mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, (torch.randn(5, 8),)


def test_python_sequential_discovered_via_spec(tmp_path, monkeypatch):
    """`python:module:function` with an nn.Sequential (no layer_names): layers are the Linears, in order."""
    (tmp_path / "my_seq_model.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        def build():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            return model, (torch.randn(5, 8),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse_model_spec("python:my_seq_model:build")
    assert spec.config is None
    model, inputs = spec.builder()
    p = measure_profile(model, inputs, name=spec.name, repeats=2, warmup=1)
    assert [l.name for l in p.layers] == ["0", "2", "4"]
    assert [l.params for l in p.layers] == [8 * 16 + 16, 16 * 32 + 32, 32 * 4 + 4]
    assert p.params == sum(q.numel() for q in model.parameters())
    assert (p.micro_batch, p.seq, p.input_bytes) == (5, 0, 5 * 8 * 4)  # rows of a 2-D input are its batch
    assert p.source == "measured" and p.fingerprint == fingerprint(model)


def test_sequential_activations_segment_rule():
    """Linear "0" saves the example input (not an activation: input_bytes); the ReLU after it
    saves its output, counted in "0" (the layer that ran last); Linear "2" saves that same
    storage again (counted once); "4" likewise re-saves the second ReLU's output."""
    model, inputs = _mlp()
    p = measure_profile(model, inputs, name="seq", repeats=1, warmup=0)
    assert [l.activation_bytes for l in p.layers] == [5 * 16 * 4, 5 * 32 * 4, 0]


class _Reordered(nn.Module):
    """Registration order (late, early) differs from execution order (early, late); `trunk`
    is a parameter-free wrapper around a ModuleList; `scale` is a root parameter."""

    def __init__(self):
        super().__init__()
        self.late = nn.Linear(4, 2)
        self.trunk = nn.Module()
        self.trunk.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.early = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        x = self.early(x)
        for layer in self.trunk.layers:
            x = torch.tanh(layer(x))
        return (self.late(x) * self.scale).pow(2).mean()


def test_discovery_execution_order_wrapper_and_root_params():
    model = _Reordered()
    x = torch.randn(3, 4)
    assert resolve_layers(model, (x,)) == ["", "early", "trunk.layers.0", "trunk.layers.1", "late"]
    p = measure_profile(model, (x,), name="r", repeats=1, warmup=0)
    assert [(l.name, l.params) for l in p.layers] == [("", 1), ("early", 20), ("trunk.layers.0", 20),
                                                       ("trunk.layers.1", 20), ("late", 10)]


def test_shared_parameter_counted_once():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    p = measure_profile(model, (torch.randn(2, 4),), name="tied", repeats=1, warmup=0)
    assert p.params == 16 + 4 + 4
    # The tied weight spans both layers: FSDP2 needs it in one group, so both leaves go to the root.
    assert [(l.name, l.params) for l in p.layers] == [("", 24)]
    assert p.tied == (("0.weight", "1.weight"),)


def test_gpt_profile_layers_children_times():
    model, inputs = build_gpt(PRESETS["tiny"], micro_batch=2, seq=32)
    p = measure_profile(model, inputs, name="tiny", repeats=3, warmup=1)
    assert [l.name for l in p.layers] == model.layer_names()
    assert (p.micro_batch, p.seq, p.input_bytes) == (2, 32, 2 * 2 * 32 * 8)
    assert [c.name for c in p.layers[1].children] == ["blocks.0.ln1", "blocks.0.attn", "blocks.0.ln2", "blocks.0.mlp"]
    assert [c.name for c in p.layers[-1].children] == ["head.ln", "head.out"]
    for layer in p.layers:
        assert layer.forward_seconds > 0 and layer.backward_seconds > 0, layer.name
        assert sum(c.params for c in layer.children) == layer.params
        assert sum(c.forward_seconds for c in layer.children) <= layer.forward_seconds
        assert sum(c.activation_bytes for c in layer.children) <= layer.activation_bytes


def test_measure_leaves_model_alone():
    model, inputs = build_gpt(PRESETS["tiny"], micro_batch=1, seq=16)
    model.head.out.weight.grad = torch.full_like(model.head.out.weight, 7.0)
    p = measure_profile(model, inputs, name="tiny", repeats=1, warmup=0, compute_dtype="bfloat16")
    assert p.compute_dtype == "bfloat16"
    assert all(q.dtype == torch.float32 for q in model.parameters())
    assert torch.all(model.head.out.weight.grad == 7.0)
    assert model.embed.tok.weight.grad is None


def test_explicit_layers_and_errors():
    model, inputs = _mlp()
    p = measure_profile(model, inputs, name="seq", layers=["0", "2", "4"], repeats=1, warmup=0)
    assert [l.name for l in p.layers] == ["0", "2", "4"]
    with pytest.raises(UsageError, match="unknown layer"):
        measure_profile(model, inputs, name="seq", layers=["0", "nope"])
    nested = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    with pytest.raises(UsageError, match="overlap"):
        measure_profile(nested, (torch.randn(1, 2),), name="n", layers=["0", "0.0", "1"])
    with pytest.raises(UsageError, match="compute dtype"):
        measure_profile(model, inputs, name="seq", compute_dtype="int4")


def test_json_round_trip():
    model, inputs = build_gpt(PRESETS["tiny"], micro_batch=1, seq=16)
    p = measure_profile(model, inputs, name="tiny", repeats=1, warmup=0)
    q = Profile.from_json(p.to_json())
    assert q == p
    assert q.layers[1].children[0].name == "blocks.0.ln1"
