"""GPU presets from public measurements (issue 18): causal attention priced as such, memory as
the parts expose it, and the published configurations the efficiencies were fitted to."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from shardsched.cost.device import DEVICES, GiB
from shardsched.models.gpt import Attention
from shardsched.models.gpt_config import GPTConfig
from shardsched.profile.analytic import ATTENTION_BACKWARD, causal_attention_flops, causal_share
from shardsched.profile.attention_flops import CAUSAL_SDPA_FORMULAS


def test_causal_share_counts_the_mask():
    """Brute force: the ones of SDPA's causal mask, tril of (s_q, s_k)."""
    for s_q, s_k in ((1, 1), (7, 7), (64, 64), (5, 9), (9, 5)):
        ones = int(torch.ones(s_q, s_k, dtype=torch.bool).tril().sum())
        assert causal_share(s_q, s_k, True) == pytest.approx(ones / (s_q * s_k))
        assert causal_share(s_q, s_k, False) == 1.0


@pytest.mark.parametrize("is_causal", [True, False])
def test_formulas_on_the_real_cpu_kernel(is_causal):
    """FlopCounterMode with the causal formulas, on the kernel CPU tensors dispatch to:
    forward 4*b*heads*s^2*d times the computed share, backward 2.5x that."""
    torch.manual_seed(0)
    b, heads, s, d = 2, 3, 16, 8
    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False, custom_mapping=CAUSAL_SDPA_FORMULAS) as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    fwd = counts[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu]
    bwd = counts[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward]
    full = 4 * b * heads * s * s * d
    assert fwd == int(full * causal_share(s, s, is_causal))
    assert bwd == int(ATTENTION_BACKWARD * full * causal_share(s, s, is_causal))


def test_analytic_attention_equals_what_the_kernel_is_counted():
    """The analytic profile's attention FLOPs == FlopCounterMode's (causal formulas) on the
    project's own Attention module: the count `profile/trace_record.py` gets once its `_CUSTOM`
    maps these two ops to `CAUSAL_SDPA_FORMULAS` (before: exactly 2s/(s+1) times more)."""
    cfg = GPTConfig(layers=1, hidden=32, heads=4, seq=24)
    b, s = 2, 24
    attn = Attention(cfg)
    x = torch.randn(b, s, cfg.hidden, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=CAUSAL_SDPA_FORMULAS) as counter:
        attn(x).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    fwd = counts[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu]
    assert fwd == causal_attention_flops(b=b, s=s, h=cfg.hidden)
    assert fwd == pytest.approx(4 * b * s * s * cfg.hidden * (s + 1) / (2 * s))  # the lower triangle


def test_presets_state_memory_as_the_part_exposes_it():
    assert DEVICES["h100"].memory_bytes == 81089 << 20 and 79 * GiB < DEVICES["h100"].memory_bytes < 80 * GiB
    assert DEVICES["a100"].memory_bytes == 81049 << 20
    assert 139 * GiB < DEVICES["h200"].memory_bytes < 140 * GiB
    assert DEVICES["v100"].memory_bytes == 32510 << 20
    assert DEVICES["h200"].peak_flops == DEVICES["h100"].peak_flops  # one die: GH100
    for name in ("a100", "h100", "h200"):
        assert set(DEVICES[name].efficiency) == {"matmul", "attention"}


def _bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu_presets.py"
    spec = importlib.util.spec_from_file_location("bench_gpu_presets", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_published_configurations_within_15_percent():
    """Every configuration the presets were set from (bench/bench_gpu_presets.py, ~1 s), the
    MPT-13B H100 row (+16.7% before the step priced `comm_sm_share`) included."""
    bench = _bench()
    for cfg in bench.CONFIGS:
        ratio = bench.predicted_tokens_per_gpu(cfg, DEVICES[cfg.device]) / cfg.tokens_per_gpu
        assert abs(ratio - 1) <= bench.TOLERANCE, (cfg.name, ratio)


def test_steps_measured_on_an_h200_within_15_percent():
    """A 1.1B Llama's steps at world 1 as `bench/gpu_check.py` measured them on one H200: host-bound
    at 1 x 2048 tokens and under `+sac` ([Note: host time per op] in plan/schedule.py; 3.9-7.3x
    the prediction before it priced the host), within 15% now."""
    for row, measured, predicted in _bench().h200_step_ratios():
        assert abs(measured / predicted - 1) <= 0.15, (row, measured, predicted)


def test_collectives_hold_sms_on_the_gpu_presets_only():
    """The SM shares the presets cite (`DeviceSpec.comm_sm_share`): 24 of an H100's 132 SMs (H200:
    the same die), 16 of an A100's 108; nothing where collectives block compute (gloo on CPU)."""
    assert DEVICES["h100"].comm_sm_share == DEVICES["h200"].comm_sm_share == 24 / 132
    assert DEVICES["a100"].comm_sm_share == 16 / 108
    assert DEVICES["cpu"].comm_sm_share == 0.0 and not DEVICES["cpu"].overlap


def test_the_share_slows_the_row_that_overlaps_most():
    """The MPT-13B H100 row overlaps the most communication per compute second (micro-batch 2):
    its step grows by share x its overlapped seconds (= compute + communication - the unslowed
    step, [Note: collectives slow the compute beside them]); a row with little communication
    barely moves."""
    import dataclasses
    bench = _bench()
    rows = {c.name: c for c in bench.CONFIGS if c.device == "h100"}
    h100 = DEVICES["h100"]
    for name in ("MPT-13B seq 2048", "MPT-1B seq 32768"):
        slowed, plain = (bench.predicted(rows[name], d) for d in (h100, bench.unshared(h100)))
        overlap = plain.compute_seconds + plain.comm_seconds - plain.step_seconds
        assert slowed.step_seconds == pytest.approx(plain.step_seconds + h100.comm_sm_share * overlap, rel=1e-9)
        assert slowed.comm_seconds == pytest.approx(plain.comm_seconds, rel=1e-9)
        assert slowed.step_seconds - slowed.compute_seconds == pytest.approx(
            plain.step_seconds - plain.compute_seconds, rel=1e-6, abs=1e-12)  # the slowdown is compute's
    assert dataclasses.replace(h100, comm_sm_share=0.0) == bench.unshared(h100)


def test_torchtitan_memory_rows_and_the_fall_from_8_to_128_gpus():
    """torchtitan's Llama 3.1 8B +sac runs (82.4 and 67.0 GiB reserved on 8 and 128 H100s): the
    reserved prediction at 85-100% of each (0.896, 0.892; the every-matmul policy, `+sac-all`,
    gives 1.13, 1.18), and the fall between them within 10% of the published 15.4 GiB (14.0: [Note:
    reserved at scale]; the allocated peaks alone fall 10.5)."""
    bench = _bench()
    lo, hi = bench.MEMORY_RANGE
    got = {}
    for cfg in bench.MEMORY:
        plan = bench.planned(cfg, DEVICES[cfg.device])[0]
        got[cfg.world] = bench.reserved_bytes(plan) / GiB
        assert lo <= got[cfg.world] / cfg.reserved_gib <= hi, (cfg.name, got[cfg.world])
    published = {c.world: c.reserved_gib for c in bench.MEMORY}
    assert (got[8] - got[128]) / (published[8] - published[128]) == pytest.approx(1, abs=0.1)


def test_llama2_70b_batch_1_sac_fits_the_a100_it_ran_on():
    """torchtitan ran Llama-2-70B at local batch 1 with op-level selective checkpointing on 64
    A100 80GB (batch 2 ran out of memory): predicted 58.4 GiB (62.5 reserved) under `+sac`; the
    every-matmul policy (`+sac-all`, `+sac` before issue 28) predicted 81.0, over the card."""
    bench = _bench()
    cfg = next(c for c in bench.CONFIGS if c.name.startswith("Llama-2-70B"))
    plan = bench.planned(cfg, DEVICES["a100"])[0]
    assert bench.reserved_bytes(plan) < DEVICES["a100"].memory_bytes
    # and batch 2 under +sac, which ran out of memory there, does not fit (97.6 GiB)
    assert bench.planned(cfg._replace(micro_batch=2), DEVICES["a100"])[0].predicted.peak_bytes > \
        DEVICES["a100"].memory_bytes
