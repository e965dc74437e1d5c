"""Analytic profiles: exact names/shapes/fingerprints vs the real GPT, activations vs measure_profile."""
from __future__ import annotations

import itertools
import time

import pytest
import torch

from shardsched.cost.device import DEVICES
from shardsched.profile.analytic import analytic_profile, gpt_param_shapes
from shardsched.profile.fingerprint import fingerprint
from shardsched.profile.measure import measure_profile
from shardsched.models.spec import PRESETS, build_gpt
from shardsched.profile.types import Profile
from shardsched.models.gpt import GPT, GPTConfig

SWIGLU_RMS = GPTConfig(vocab=256, layers=3, hidden=128, heads=4, ffn=200, seq=128,
                       mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)


@pytest.mark.parametrize("mlp,norm,bias,learned_pos",
                         list(itertools.product(("gelu", "swiglu"), ("layernorm", "rmsnorm"), (True, False), (True, False))))
def test_param_shapes_equal_real_module(mlp, norm, bias, learned_pos):
    cfg = GPTConfig(vocab=50, layers=2, hidden=32, heads=2, ffn=48, seq=16, mlp=mlp, norm=norm,
                    bias=bias, learned_pos=learned_pos)
    model = GPT(cfg)
    assert gpt_param_shapes(cfg) == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert analytic_profile(cfg, micro_batch=1, seq=8, device=DEVICES["cpu"]).fingerprint == fingerprint(model)


def _rel(measured: int, predicted: int) -> float:
    return abs(predicted - measured) / max(measured, 1)


@pytest.mark.parametrize("cfg,dtype", [(PRESETS["tiny"], "float32"), (SWIGLU_RMS, "float32"),
                                       (PRESETS["tiny"], "bfloat16")], ids=["tiny", "swiglu-rmsnorm", "tiny-bf16"])
def test_analytic_matches_measured(cfg, dtype):
    torch.set_num_threads(1)
    b, s = 2, 64
    model, inputs = build_gpt(cfg, micro_batch=b, seq=s)
    measured = measure_profile(model, inputs, name="m", repeats=1, warmup=0, compute_dtype=dtype)
    predicted = analytic_profile(cfg, micro_batch=b, seq=s, device=DEVICES["cpu"], compute_dtype=dtype)
    assert measured.fingerprint == predicted.fingerprint
    assert [l.name for l in measured.layers] == [l.name for l in predicted.layers]
    assert measured.input_bytes == predicted.input_bytes == 2 * 8 * b * s
    for m, p in zip(measured.layers, predicted.layers):
        assert m.params == p.params, m.name
        assert [c.name for c in m.children] == [c.name for c in p.children]
        assert [c.params for c in m.children] == [c.params for c in p.children]
        print(f"{m.name:10s} measured {m.activation_bytes:9d} analytic {p.activation_bytes:9d} "
              f"error {_rel(m.activation_bytes, p.activation_bytes):.2%}")
        assert _rel(m.activation_bytes, p.activation_bytes) <= 0.10, m.name
        for mc, pc in zip(m.children, p.children):
            assert _rel(mc.activation_bytes, pc.activation_bytes) <= 0.10, mc.name
    total_m = sum(l.activation_bytes for l in measured.layers)
    total_p = sum(l.activation_bytes for l in predicted.layers)
    assert _rel(total_m, total_p) <= 0.02


def _gpt_closed_form(*, vocab: int, layers: int, h: int, seq: int) -> int:
    """GPT-2 shaped: per block 12h^2 + 13h (ln 2h x2, qkv 3h^2+3h, proj h^2+h, fc 4h^2+4h, proj 4h^2+h)."""
    return vocab * h + seq * h + layers * (12 * h * h + 13 * h) + 2 * h + vocab * h  # last: untied head


def test_gpt2_params():
    expected = _gpt_closed_form(vocab=50257, layers=12, h=768, seq=1024)
    # Published GPT-2 small is 124,439,808 with the head tied to the token embedding.
    assert expected == 124_439_808 + 50257 * 768
    p = analytic_profile(PRESETS["gpt2"], micro_batch=1, seq=1024, device=DEVICES["a100"])
    assert abs(p.params - expected) / expected < 0.01
    assert p.layers[1].params == 12 * 768 ** 2 + 13 * 768


def test_llama7b_params():
    # LLaMA-7B: 6.7B (Touvron et al. 2023, Table 2); its head is untied already.
    p = analytic_profile(PRESETS["llama-7b"], micro_batch=1, seq=4096, device=DEVICES["a100"])
    assert abs(p.params - 6.7e9) / 6.7e9 < 0.03
    h, f = 4096, 11008
    assert p.layers[1].params == 4 * h * h + 3 * h * f + 2 * h


def test_gpt3_params_and_speed():
    t0 = time.perf_counter()
    p = analytic_profile(PRESETS["gpt3-175b"], micro_batch=1, seq=2048, device=DEVICES["h100"])
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed
    assert abs(p.params - 175e9) / 175e9 < 0.02
    assert len(p.layers) == 98 and p.layers[-2].name == "blocks.95"


def test_time_model():
    """Per op class (issue 18): matmuls 2*params*tokens at the matmul efficiency, causal
    attention half of 4*b*s^2*h at the attention efficiency; backward 2x and 2.5x."""
    cfg, b, s = PRESETS["gpt2"], 4, 1024
    dev = DEVICES["a100"]
    p = analytic_profile(cfg, micro_batch=b, seq=s, device=dev)
    block = p.layers[1]
    mm = 2 * block.params * b * s / (dev.peak_flops * dev.efficiency["matmul"])
    attn = 2 * b * s * s * cfg.hidden / (dev.peak_flops * dev.efficiency["attention"])
    # + the memory-bound ops' bytes at the bandwidth ([Note: memory-bound work in analytic
    # blocks]): layer norms 2 x 2h, GELU 2 ffn, residual adds 6h forward; 2 x 6h, 6h, 3 ffn backward
    h, f, unit = cfg.hidden, cfg.ffn_size, b * s * 2 / 2.0e12
    assert block.forward_seconds == pytest.approx(mm + attn * (s + 1) / s + (10 * h + 2 * f) * unit, rel=1e-9)
    assert block.backward_seconds == pytest.approx(2 * mm + 2.5 * attn * (s + 1) / s + (18 * h + 3 * f) * unit,
                                                   rel=1e-9)
    head = p.layers[-1]
    assert head.forward_seconds >= 2 * cfg.hidden * cfg.vocab * b * s / (dev.peak_flops * dev.efficiency["matmul"])
    assert p.layers[0].forward_seconds < 0.05 * block.forward_seconds  # embedding is a gather


def test_activations_vs_korthikanti():
    """16-bit gelu block with f = 4h: 32 sbh + stats/logsumexp, below Korthikanti's 34 + 5as/h
    (no dropout, fused attention); their 5as/h term is what flash attention removes."""
    cfg, b, s = PRESETS["gpt2"], 2, 1024
    p = analytic_profile(cfg, micro_batch=b, seq=s, device=DEVICES["a100"], compute_dtype="bfloat16")
    sbh = s * b * cfg.hidden
    act = p.layers[1].activation_bytes
    assert 32 * sbh < act < 33 * sbh
    assert act < sbh * (34 + 5 * cfg.heads * s / cfg.hidden)
    # fp32 doubles everything but the fp32 statistics.
    p32 = analytic_profile(cfg, micro_batch=b, seq=s, device=DEVICES["a100"], compute_dtype="float32")
    assert 1.9 < p32.layers[1].activation_bytes / act < 2.0
    # Head: fp32 log-probs dominate.
    assert p.layers[-1].activation_bytes > 4 * b * s * cfg.vocab


def test_fused_rmsnorm_on_gpu_saves_less():
    cfg = PRESETS["llama-7b"]
    gpu = analytic_profile(cfg, micro_batch=1, seq=512, device=DEVICES["h100"])
    cpu = analytic_profile(cfg, micro_batch=1, seq=512, device=DEVICES["cpu"])
    ln_gpu, ln_cpu = gpu.layers[1].children[0], cpu.layers[1].children[0]
    assert ln_gpu.name == "blocks.0.ln1"
    assert ln_gpu.activation_bytes == 512 * 4096 * 2 + 4 * 512
    assert ln_cpu.activation_bytes == 2 * 512 * 4096 * 4 + 4 * 512


def test_json_round_trip():
    p = analytic_profile(PRESETS["llama-7b"], micro_batch=2, seq=256, device=DEVICES["h100"], name="llama-7b")
    q = Profile.from_json(p.to_json())
    assert q == p
    assert q.layers[2].children[1].name == "blocks.1.attn"


def test_bad_arguments():
    from shardsched.errors import UsageError
    with pytest.raises(UsageError):
        analytic_profile(PRESETS["gpt2"], micro_batch=1, seq=2048, device=DEVICES["a100"])  # > position table
    with pytest.raises(UsageError):
        analytic_profile(PRESETS["gpt2"], micro_batch=1, seq=8, device=DEVICES["a100"], compute_dtype="int8")


@pytest.mark.parametrize("mlp,norm", [("swiglu", "rmsnorm"), ("gelu", "layernorm")])
def test_memory_bound_counts_are_the_traces(mlp, norm):
    """The bytes analytic blocks price memory-bound ops at ([Note: memory-bound work in analytic
    blocks]) are what the trace of the same block counts (CPU: the composite RMSNorm), within
    1% (the trace adds a few fp32 statistics per token)."""
    import torch

    from shardsched.models.spec import build_gpt
    from shardsched.profile import analytic as an
    from shardsched.profile.trace import trace_profile
    torch.set_num_threads(1)
    cfg = GPTConfig(layers=2, hidden=256, heads=4, ffn=768, vocab=512, seq=64, mlp=mlp, norm=norm, bias=False)
    model, inputs = build_gpt(cfg, micro_batch=2, seq=64)
    block = trace_profile(model, inputs, name="g", device=DEVICES["cpu"], compute_dtype="bfloat16").layers[1]
    per = {k: an._moved_elements(cfg, k, fused_rms=False) for k in ("ln1", "attn", "ln2", "mlp")}
    unit = 2 * 64 * 2  # tokens x bf16 bytes
    assert block.forward_moved_bytes == pytest.approx(
        unit * (sum(f for f, _ in per.values()) + an.RESIDUAL_ELEMENTS * cfg.hidden), rel=0.01)
    assert block.backward_moved_bytes == pytest.approx(unit * sum(b for _, b in per.values()), rel=0.01)
