"""--model specs: presets, gpt:key=value, python:module:function, and one-line errors."""
from __future__ import annotations

import pytest
import torch

from shardsched.errors import UsageError
from shardsched.models.spec import PRESETS, build_gpt, parse_model_spec
from shardsched.models.gpt import GPTConfig


def test_presets():
    for name in ("tiny", "small", "gpt2", "gpt2-xl", "llama-7b", "llama-70b", "gpt3-175b"):
        spec = parse_model_spec(name)
        assert spec.name == name and spec.config == PRESETS[name] and spec.builder is None
    assert PRESETS["tiny"] == GPTConfig(vocab=256, layers=4, hidden=128, heads=4, seq=128)
    assert PRESETS["llama-70b"].ffn_size == 28672 and PRESETS["gpt2-xl"].hidden == 1600


def test_gpt_spec():
    spec = parse_model_spec("gpt:layers=2, hidden=64,heads=2,mlp=swiglu,norm=rmsnorm,bias=false,learned_pos=0,ffn=100")
    assert spec.config == GPTConfig(layers=2, hidden=64, heads=2, mlp="swiglu", norm="rmsnorm", bias=False,
                                    learned_pos=False, ffn=100)
    assert parse_model_spec("gpt:").config == GPTConfig()


@pytest.mark.parametrize("spec,fragment", [
    ("nope", "unknown model 'nope'"),
    ("gpt:layers=two", "not an integer"),
    ("gpt:depth=3", "unknown key 'depth'"),
    ("gpt:layers", "expected key=value"),
    ("gpt:hidden=100,heads=3", "must divide"),
    ("gpt:mlp=relu", "accepted gelu, swiglu"),
    ("gpt:bias=maybe", "accepted true or false"),
    ("python:no_such_module_xyz:build", "cannot import"),
    ("python:json:no_such_function", "no function"),
    ("python:justone", "expected python:module:function"),
])
def test_bad_specs_raise_one_line_usage_errors(spec, fragment):
    with pytest.raises(UsageError) as info:
        parse_model_spec(spec)
    msg = str(info.value)
    assert "\n" not in msg and fragment in msg
    if spec.startswith("gpt:") and "=" in spec and "mlp" not in spec and "bias" not in spec:
        assert "accepted keys: layers, hidden, heads, ffn, vocab, seq, mlp, norm, bias, learned_pos" in msg
    if not spec.startswith("gpt:"):
        assert "gpt:key=value" in msg and "python:module:function" in msg and "gpt2" in msg


def test_gpt_missing_equals_names_keys():
    with pytest.raises(UsageError, match="accepted keys: layers"):
        parse_model_spec("gpt:layers")


def test_python_builder_checks_return(tmp_path, monkeypatch):
    (tmp_path / "bad_builder_mod.py").write_text("def build():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse_model_spec("python:bad_builder_mod:build")
    with pytest.raises(UsageError, match="must return"):
        spec.builder()


def test_build_gpt_is_deterministic_and_leaves_rng():
    state = torch.random.get_rng_state()
    m1, (idx1, tgt1) = build_gpt(PRESETS["tiny"], micro_batch=3, seq=16, seed=5)
    m2, (idx2, tgt2) = build_gpt(PRESETS["tiny"], micro_batch=3, seq=16, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert idx1.shape == (3, 16) and idx1.dtype == torch.int64 and int(idx1.max()) < 256
    assert torch.equal(idx1, idx2) and torch.equal(tgt1, tgt2)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert m1(idx1, tgt1).dim() == 0
    with pytest.raises(UsageError):
        build_gpt(PRESETS["tiny"], micro_batch=1, seq=129)
