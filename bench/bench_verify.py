"""Verification: what it costs and what it finds (every plan runs once under FSDP2 on fake tensors).

Prints, per model and world, the CPU seconds `shardsched.verify.engine.verify_plan` took and
verified / predicted peak, side by side:
- the Llama presets from their configs (`llama-7b` at world 64, `llama-70b` at world 512:
  analytic profile, `solve.build.make_plan`, the model built on the meta device);
- the hand-written user models of issue 26 (tests/verify/user_models.py) through
  `shardsched.api.plan_model` at world 4;
and over a sample of the generator's cases (tests/plan/_generated.py, issue 26's structures
included: `draw_case(seed, extended=True)`) the error distribution and how many auto plans the
closed loop corrected (`verify.loop.closed_loop`: the note "planned again after verification").

    .venv/bin/python bench/bench_verify.py [--cases 40] [--seed 0] [--no-presets]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

ROW = "{:<28s} {:>6s} {:<16s} {:>9s} {:>11s} {:>11s} {:>9s}"


def row(model: str, world: int, strategy: str, seconds: float, predicted: int, verified: int) -> None:
    print(ROW.format(model, str(world), strategy, f"{seconds:.1f}", f"{predicted / 2**20:.1f}",
                     f"{verified / 2**20:.1f}", f"{verified / predicted:.4f}"), flush=True)


def presets() -> None:
    from shardsched.core.types import Precision
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.models.spec import parse_model_spec
    from shardsched.profile.resolve import build_model, profiled
    from shardsched.solve.build import make_plan
    from shardsched.verify.engine import verify_plan
    for name, world, strategy in (("llama-7b", 64, "full_shard"), ("llama-70b", 512, "full_shard"),
                                  ("llama-70b", 512, "full_shard+ckpt")):
        spec = parse_model_spec(name)
        prof = profiled(spec, micro_batch=1, seq=None, device=DEVICES["h100"], precision=Precision.BF16_MIXED).profile
        plan = make_plan(prof, Cluster(world=world, gpus_per_node=8, device=DEVICES["h100"]), strategy=strategy,
                         precision="bf16-mixed")
        model, inputs = build_model(spec, micro_batch=1, seq=None)
        t0 = time.process_time()
        v = verify_plan(model, inputs, plan)
        row(name, world, strategy, time.process_time() - t0, plan.predicted.peak_bytes, v.peak_bytes)


def user_models() -> None:
    from shardsched.api import plan_model
    from shardsched.verify.subject import Subject, verifier
    from tests.verify import user_models as um
    for name, strategy in (("vit", "full_shard"), ("vit", "replicate"), ("vit", "full_shard+sac"),
                           ("dino", "full_shard"), ("dino", "replicate"), ("shared", "full_shard"),
                           ("gnn", "full_shard"), ("gnn", "full_shard+sac"), ("gnn", "full_shard+ckpt"),
                           ("lstm", "full_shard"), ("lstm", "full_shard+ckpt"), ("gru", "full_shard+ckpt"),
                           ("clip", "full_shard")):
        model, inputs = getattr(um, f"build_{name}")()
        plan = plan_model(model, inputs, world=4, strategy=strategy, headroom="0", verify=False)
        t0 = time.process_time()  # as plan_model verifies (fake tensors, or real ones for a model that needs values)
        v = verifier(Subject(model, inputs, lambda **_: (model, inputs)))(plan)
        row(f"user:{name}", 4, strategy, time.process_time() - t0, plan.predicted.peak_bytes, v.peak_bytes)


def sample(n: int, first: int) -> None:
    from tests.plan._generated import EXTENDED, draw_case, verified_case
    errors, auto, corrected, over, failed = [], 0, 0, 0, 0
    print(f"\n{'seed':>6s} {'family':<8s} {'plan':<28s} {'world':>5s} {'error':>8s}  closed loop")
    for k in range(first, first + n):
        s, ps = draw_case(k, extended=True)
        try:
            c = verified_case(s, ps)
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a finding too
            failed += 1
            print(f"{k:6d} {s.family:<8s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        errors.append(c["error"])
        if ps.strategy == "auto":
            auto += 1
            corrected += c["replanned"]
            over += c["measured"] > c["budget"]
        word = ps.strategy + ("/" + ps.other if ps.other else "")
        family = ("unet" if s.skip else s.family) + ("*" if s.family in EXTENDED else "")
        print(f"{k:6d} {family:<8s} {word:<28s} {ps.world:5d} {c['error']:+8.2%}  "
              f"{'planned again' if c['replanned'] else ''}", flush=True)
    if not errors:
        return
    qs = statistics.quantiles(errors, n=100) if len(errors) > 1 else errors * 99
    within = sum(abs(e) <= 0.03 for e in errors)
    print(f"\n{len(errors)} cases ({failed} failed): predicted/verified - 1 from {min(errors):+.2%} to {max(errors):+.2%},"
          f" median {statistics.median(errors):+.2%}, 1st/99th percentile {qs[0]:+.2%} / {qs[-1]:+.2%},"
          f" within 3%: {within}/{len(errors)}")
    print(f"auto plans: {auto}; corrected by the closed loop (planned again after verification): {corrected};"
          f" verified over their usable budget: {over}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-presets", action="store_true")
    args = ap.parse_args()
    print(ROW.format("model", "world", "strategy", "verify s", "pred MiB", "verif MiB", "ver/pred"))
    t0 = time.time()
    if not args.no_presets:
        presets()
    user_models()
    sample(args.cases, args.seed)
    print(f"\n{time.time() - t0:.0f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
