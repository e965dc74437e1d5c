"""From a `--model` spec to a Profile: analytic for configs, measured for code."""
from __future__ import annotations

from shardsched.cost.device import DeviceSpec
from shardsched.errors import UsageError
from shardsched.core.types import Precision
from shardsched.profile.analytic import analytic_profile
from shardsched.models.spec import ModelSpec, build_gpt
from shardsched.profile.types import Profile


def compute_dtype(precision: Precision) -> str:
    """Activations and times are taken in the dtype the workers compute in."""
    return "bfloat16" if precision is Precision.BF16_MIXED else "float32"


def profile_for(spec: ModelSpec, *, micro_batch: int, seq: int | None, device: DeviceSpec,
                precision: Precision, measure: bool = False, repeats: int = 3) -> Profile:
    """Analytic profile of a GPT config on `device` (no model in memory), or a
    profile measured on this machine for `python:` models (or with `measure`)."""
    if micro_batch < 1:
        raise UsageError(f"--micro-batch must be >= 1, got {micro_batch}")
    dtype = compute_dtype(precision)
    if spec.config is not None:
        seq = seq or spec.config.seq
        if seq < 1:
            raise UsageError(f"--seq must be >= 1, got {seq}")
        if not measure:
            return analytic_profile(spec.config, micro_batch=micro_batch, seq=seq, device=device,
                                    compute_dtype=dtype, name=spec.name)
        model, inputs = build_gpt(spec.config, micro_batch=micro_batch, seq=seq)
    else:
        model, inputs = spec.builder()
    from shardsched.profile.measure import measure_profile  # imports torch: only when measuring

    return measure_profile(model, inputs, name=spec.name, repeats=repeats, warmup=1, compute_dtype=dtype)
