"""From a `--model` spec to a Profile: analytic for GPT configs, traced on fake tensors
for code (`python:`, `hf:`), measured on this machine only when asked (`measure`)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, NamedTuple

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
                precision: Precision, measure: bool = False, repeats: int = 3, layers: str | None = None) -> Profile:
    """Analytic profile of a GPT config on `device` (no model in memory); a traced
    profile (fake tensors: exact bytes, FLOPs, deterministic) for `python:` and `hf:`
    models; a profile measured on this machine with `measure` (cached, see `measured`).
    `layers`: `--layers`, the unit boundaries the user names (profile.layers, [Note: naming
    layers]); a GPT config is then traced, since its analytic profile has fixed layers."""
    return profiled(spec, micro_batch=micro_batch, seq=seq, device=device, precision=precision, measure=measure,
                    repeats=repeats, layers=layers).profile


class Profiled(NamedTuple):
    """A profile and the model it was taken from (None: a GPT config profiled analytically),
    with one worker's example inputs: what `shardsched.verify` runs the plan on."""

    profile: Profile
    model: Any
    inputs: tuple


def build_model(spec: ModelSpec, *, micro_batch: int, seq: int | None, measure: bool = False,
                layers: str | None = None, position_table: int | None = None) -> tuple[Any, tuple]:
    """(model, example inputs) of `spec` as profiling builds it: GPT configs and `hf:` models
    on the meta device (nothing allocated) unless `measure`; `python:` models as their code builds them.
    `position_table`: a GPT config's learned position table as `train` sizes it (`train.config.model_config`)."""
    if spec.config is not None:
        import torch
        config = spec.config
        if position_table and config.learned_pos:
            config = dataclasses.replace(config, seq=position_table)
        with torch.device("cpu" if measure else "meta"):
            model, inputs = build_gpt(config, micro_batch=micro_batch, seq=seq or config.seq)
    elif spec.sized:
        model, inputs = spec.builder(micro_batch=micro_batch, seq=seq, device="cpu" if measure else "meta")
    else:
        model, inputs = spec.builder()
    if layers is not None:
        from shardsched.profile.layers import SPEC_ATTR, resolve_spec
        resolve_spec(model, layers)  # a name that matches nothing: one line, before any profiling
        setattr(model, SPEC_ATTR, layers)
    return model, inputs


def profiled(spec: ModelSpec, *, micro_batch: int, seq: int | None, device: DeviceSpec, precision: Precision,
             measure: bool = False, repeats: int = 3, layers: str | None = None) -> Profiled:
    """`profile_for`, keeping the model it built."""
    if micro_batch < 1:
        raise UsageError(f"--micro-batch must be >= 1, got {micro_batch}")
    if seq is not None and seq < 1:
        raise UsageError(f"--seq must be >= 1, got {seq}")
    dtype = compute_dtype(precision)
    if spec.config is not None and not measure and layers is None:
        seq = seq or spec.config.seq
        return Profiled(analytic_profile(spec.config, micro_batch=micro_batch, seq=seq, device=device,
                                         compute_dtype=dtype, name=spec.name), None, ())
    model, inputs = build_model(spec, micro_batch=micro_batch, seq=seq, measure=measure, layers=layers)
    if measure:
        return Profiled(measured(model, inputs, name=spec.name, repeats=repeats, compute_dtype=dtype), model, inputs)
    def real():
        return build_model(spec, micro_batch=micro_batch, seq=seq, measure=True, layers=layers)
    return traced_or_measured(model, inputs, name=spec.name, device=device, dtype=dtype, repeats=repeats, real=real)


def traced_or_measured(model, inputs: tuple, *, name: str, device: DeviceSpec, dtype: str, repeats: int = 3,
                       real=None) -> Profiled:
    """The traced profile; for a model fake tensors cannot run, the trace on real tensors;
    for one that cannot be traced at all, the measured one.

    [Note: a model fake tensors cannot run] Its code reads tensor values (a boolean mask it
    computes, `.item()`, CTC's lengths). Only those values need a real run: the same trace runs
    on real copies of its parameters and inputs on this machine ([Note: a trace on real
    tensors] in profile/trace_fake.py), so bytes and FLOPs are counted as on fake tensors and
    the seconds are the `--device` preset's, as for any traced model. Measuring the whole model
    here instead (what `--measure` does) gave a GPU plan this CPU's seconds. The plan says so
    in one line. A model on the meta device is built for real first (`real()`); a model the
    real trace refuses too is measured."""
    from shardsched.profile.trace import Untraceable, trace_profile  # imports torch: only for code models
    from shardsched.profile import cache

    def traced(tensors: str, model, inputs, *key_parts) -> Profile:
        key = cache.model_key(model, inputs, name, repr(device), dtype, *key_parts)
        return cache.cached("traced", key, lambda: trace_profile(model, inputs, name=name, device=device,
                                                                 compute_dtype=dtype, tensors=tensors),
                            to_text=Profile.to_json, from_text=Profile.from_json)
    try:  # [Note: the profile cache]: a second plan of the same model skips the trace
        return Profiled(traced("fake", model, inputs), model, inputs)
    except Untraceable as why:
        if any(p.device.type == "meta" for p in model.parameters()):
            if real is None:
                raise
            model, inputs = real()
        op = str(why).split(": ", 1)[1].split("; accepted")[0] if ": " in str(why) else str(why)
    try:
        profile = traced("real", model, inputs, "real", cache.values_digest(model, inputs))
        note = (f"profiled by running the model on real tensors on this machine (it cannot run on fake tensors: "
                f"{op[:160]}): bytes and FLOPs traced, times the --device preset's")
    except Untraceable:
        profile = measured(model, inputs, name=name, repeats=repeats, compute_dtype=dtype)
        note = (f"profiled by running the model on this machine (it cannot run on fake tensors: {op[:160]}): "
                f"times are this machine's, not the --device preset's")
    extra = {**profile.extra, "notes": (*profile.extra.get("notes", ()), note)}
    return Profiled(dataclasses.replace(profile, extra=extra), model, inputs)


def measured(model, inputs, *, name: str, repeats: int, compute_dtype: str) -> Profile:
    """A measured profile, cached by the model's fingerprint, input shapes, dtype and
    threads: the first measurement is reused, so timing noise cannot flip a plan
    between two runs of the same command (delete the cache to re-measure)."""
    import torch

    from shardsched.profile.fingerprint import fingerprint
    from shardsched.profile.measure import measure_profile
    shapes = [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)]
    key = hashlib.sha256(json.dumps([fingerprint(model), str(shapes), compute_dtype, repeats,
                                     torch.get_num_threads(), torch.__version__]).encode()).hexdigest()[:20]
    from shardsched.profile.cache import cached

    def measure() -> Profile:
        return measure_profile(model, inputs, name=name, repeats=repeats, warmup=1, compute_dtype=compute_dtype)
    profile = cached("profiles", key, measure, to_text=Profile.to_json, from_text=Profile.from_json)
    return _traced_memory(profile, model, inputs, compute_dtype)


def _traced_memory(profile: Profile, model, inputs, compute_dtype: str) -> Profile:
    """The measured profile's seconds with the trace's bytes ([Note: measured times, traced
    bytes] in profile/measure.py); the measured bytes when the trace refuses the model. The
    trace is priced on this machine's preset: only its ratios reach the profile."""
    from shardsched.cost.device import DEVICES
    from shardsched.profile.calibrate import machine_preset
    from shardsched.profile.measure import with_traced_memory
    from shardsched.profile.trace import Untraceable, trace_profile

    def trace(tensors: str) -> Profile:
        return trace_profile(model, inputs, name=profile.model, device=DEVICES[machine_preset()],
                             compute_dtype=compute_dtype, tensors=tensors)
    try:
        try:
            traced = trace("fake")
        except Untraceable:  # [Note: a trace on real tensors] in profile/trace_fake.py
            traced = trace("real")
        return with_traced_memory(profile, traced)
    except (UsageError, ValueError) as e:
        note = f"bytes measured, not traced ({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})"
        return dataclasses.replace(profile, extra={**profile.extra, "memory": note})
