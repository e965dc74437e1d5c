"""Auto plan vs every baseline over a sweep of memory budgets.

    python bench/bench_auto.py [--budgets 12] [--time-limit 10] [--only single|multi|batch|sac]

For each model config, budgets run from the least-memory plan's peak ("only
full_shard fits") to above the replicate baseline's peak ("replicate fits").
Columns: each baseline's step time relative to auto's (auto / baseline; "-"
when it does not fit); auto must be <= 1.000 against every fitting baseline.

The batch sweep (issue 18, part 2): for a fixed global batch, the micro-batch, accumulation
steps and grad-sync mode `plan --global-batch` chooses (`solve.batch`) against micro-batch 1
(its best mode), both planned by auto under the same budget: step seconds per global batch
and their ratio (micro-batch 1 / chosen; > 1: the lever pays).

The selective-checkpointing sweep (issue 18, part 1): a Llama-3-8B-class decoder at sequence
8192, at budgets from the least-memory plan's peak to the peak without checkpointing: auto
allowed only whole-layer checkpointing (the profile's selective fields removed, so no
`Problem.selective`) against auto allowed selective checkpointing too, step seconds side by
side and their ratio (whole-layer / selective; > 1: the lever pays). Analytic profiles price a
block's forward by its matmul and attention FLOPs only, so its selective recomputation (the
memory-bound rest) is priced near zero: the gain printed is an upper bound of what a GPU sees.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from shardsched.cost.device import DEVICES, Cluster
from shardsched.solve.auto import auto_plan
from shardsched.solve.baselines import uniform_baselines
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator, least_memory
from shardsched.plan.spec import parse_strategy_spec
from shardsched.core.types import Checkpoint, Optimizer, Precision
from shardsched.models.gpt_config import GPTConfig
from shardsched.profile.analytic import analytic_profile
from shardsched.models.spec import PRESETS

GiB = 1 << 30
CONFIGS = {  # name: (preset, world, gpus per node, device, micro batch, seq)
    "gpt2-xl/w8/a100": ("gpt2-xl", 8, 8, "a100", 4, 1024),
    "llama-7b/w64/a100": ("llama-7b", 64, 8, "a100", 1, 4096),
    # communication-bound: 4 nodes of 8 V100s on 100 Gb/s, short sequences
    "gpt2/w32/v100": ("gpt2", 32, 8, "v100", 2, 256),
}


MULTI_NODE = {  # name: (preset, world, gpus per node, device, micro batch, seq, precision)
    # 8 nodes of 8 A100s (200 Gb/s per GPU between nodes), LLaMA-7B, 2k tokens
    "llama-7b/8 nodes/a100": ("llama-7b", 64, 8, "a100", 1, 2048, "bf16-mixed"),
    # 32 nodes of 8 A100s, GPT-2 XL with short sequences: communication-bound
    "gpt2-xl/32 nodes/a100": ("gpt2-xl", 256, 8, "a100", 1, 512, "bf16-mixed"),
    # 32 nodes of 8 V100s (100 Gb/s), fp32 training: gradients and gathers of 4 bytes
    "gpt2-xl/32 nodes/v100/fp32": ("gpt2-xl", 256, 8, "v100", 1, 512, "fp32"),
    # 64 nodes of 8 V100s: FSDP's flat AllGather rings have 511 steps, HSDP's inter-node ring 63
    "gpt2-xl/64 nodes/v100/fp32": ("gpt2-xl", 512, 8, "v100", 1, 512, "fp32"),
}


def setup(key: str):
    if key in MULTI_NODE:
        preset, world, gpn, dev, mb, seq, _ = MULTI_NODE[key]
    else:
        preset, world, gpn, dev, mb, seq = CONFIGS[key]
    prof = analytic_profile(PRESETS[preset], micro_batch=mb, seq=seq, device=DEVICES[dev])
    return prof, Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])


def budget_sweep(prof, cl, *, count: int, precision: Precision = Precision.BF16_MIXED) -> list[int]:
    kw = dict(pins={}, precision=precision, optimizer=Optimizer.ADAM)
    lo = min(Evaluator(p).peak(least_memory(p._replace(checkpointable=True)))
             for p in candidate_problems(prof, cl, **kw))
    hi = max(s.peak for s in uniform_baselines(prof, cl, **kw)) * 1.02
    return [int(lo * (hi / lo) ** (k / (count - 1))) for k in range(count)]


def row(prof, cl, budget: int, *, time_limit: float, precision: Precision = Precision.BF16_MIXED):
    """(auto seconds, {baseline: seconds or None}, auto plan)."""
    kw = dict(pins={}, precision=precision, optimizer=Optimizer.ADAM)
    base = {s.name: (s.seconds if s.peak <= budget else None) for s in uniform_baselines(prof, cl, **kw)}
    plan = auto_plan(prof, cl, spec=parse_strategy_spec("auto"), precision=precision,
                     optimizer=Optimizer.ADAM, memory_budget_bytes=budget, time_limit=time_limit)
    return plan.predicted.step_seconds, base, plan


OLD = ("replicate", "shard_grad_op", "full_shard")


def multi_node(key: str, *, count: int, time_limit: float) -> tuple[bool, float]:
    """The multi-node sweep: auto against every uniform configuration (old and new, +ckpt).
    Returns (auto never slower than a fitting configuration, best speedup over the old three)."""
    from shardsched.tradeoff.sweep import mix_label
    prof, cl = setup(key)
    precision = Precision(MULTI_NODE[key][6])
    print(f"\n{key}  ({cl.nodes} nodes of {cl.gpus_per_node}; step seconds; '-' = does not fit)")
    never_worse, best_gain = True, 0.0
    header = None
    for b in budget_sweep(prof, cl, count=count, precision=precision):
        t0 = time.perf_counter()
        t, base, plan = row(prof, cl, b, time_limit=time_limit, precision=precision)
        if header is None:
            header = list(base)
            print(f"{'budget GiB':>10} {'auto':>8} " + " ".join(f"{k[:13]:>13}" for k in header)
                  + f" {'old best/auto':>13} {'plan s':>7} {'gap':>8}  auto mix")
        fit = [v for v in base.values() if v is not None]
        never_worse &= all(t <= v * (1 + 1e-9) for v in fit)
        old = [base[k] for k in OLD if base[k] is not None]
        gain = min(old) / t if old else float("nan")
        best_gain = max(best_gain, gain) if old else best_gain
        gap = "n/a" if plan.solver.gap is None else f"{plan.solver.gap:.1e}"
        print(f"{b / GiB:10.2f} {t:8.4f} " + " ".join(f"{base[k]:13.4f}" if base[k] else f"{'-':>13}" for k in header)
              + f" {gain:13.3f} {time.perf_counter() - t0:7.2f} {gap:>8}  {mix_label(plan)}")
    print(f"auto <= every fitting uniform configuration: {never_worse}; "
          f"best speedup over the best fitting old uniform strategy: {best_gain:.3f}x")
    return never_worse, best_gain


BATCH = {  # name: (preset, world, gpus per node, device, seq, global batch, budget GiB)
    "gpt2-xl/w8/a100/gb256": ("gpt2-xl", 8, 8, "a100", 1024, 256, 40),
    "gpt2/w32/v100/gb512": ("gpt2", 32, 8, "v100", 256, 512, 16),
    "llama-7b/w64/a100/gb512": ("llama-7b", 64, 8, "a100", 2048, 512, 40),
}


def global_batch(key: str, *, time_limit: float) -> float:
    """The chosen micro-batch against micro-batch 1 for one config; returns the ratio."""
    from shardsched.solve.batch import plan_global_batch
    preset, world, gpn, dev, seq, gb, gib = BATCH[key]
    cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])

    def profile_at(m: int):
        return analytic_profile(PRESETS[preset], micro_batch=m, seq=seq, device=DEVICES[dev])
    kw = dict(strategy="auto", budget=gib * GiB, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM,
              time_limit=time_limit)
    t0 = time.perf_counter()
    best, tried = plan_global_batch(profile_at, cl, global_batch=gb, **kw)
    one, _ = plan_global_batch(profile_at, cl, global_batch=gb, micro_batch=1, **kw)
    ratio = one.predicted.step_seconds / best.predicted.step_seconds
    print(f"{key:26} {gib:>4} {best.micro_batch:>4} x{best.accumulation:<4} {best.grad_sync.value:>5} "
          f"{best.predicted.step_seconds:9.4f} {best.predicted.peak_bytes / GiB:7.2f}   "
          f"1 x{one.accumulation:<4} {one.grad_sync.value:>5} {one.predicted.step_seconds:9.4f} "
          f"{one.predicted.peak_bytes / GiB:7.2f} {ratio:7.3f} {time.perf_counter() - t0:7.1f}")
    return ratio


def batch_sweep(*, time_limit: float) -> None:
    print("\nglobal batch (issue 18): chosen micro-batch vs micro-batch 1, auto under the budget, bf16-mixed;"
          " step seconds per global batch")
    print(f"{'config':26} {'GiB':>4} {'chosen':>12} {'sync':>5} {'step s':>9} {'peak':>7}   {'mb 1':>7} "
          f"{'sync':>5} {'step s':>9} {'peak':>7} {'1/chosen':>7} {'plan s':>7}")
    ratios = [global_batch(key, time_limit=time_limit) for key in BATCH]
    print(f"micro-batch 1 / chosen, step time per global batch: min {min(ratios):.3f}, max {max(ratios):.3f} "
          f"(>= 1 everywhere: {all(r >= 1 - 1e-9 for r in ratios)})")


SAC = {  # name: (config, world, gpus per node, device, micro batch, seq)
    "llama3-8b-class/w8/h100/seq8192": (GPTConfig(vocab=128256, layers=32, hidden=4096, heads=32, ffn=14336,
                                                  seq=8192, mlp="swiglu", norm="rmsnorm", bias=False,
                                                  learned_pos=False), 8, 8, "h100", 1, 8192),
}


def _whole_layer_only(prof):
    """The profile without what selective checkpointing keeps: auto then offers none or full only."""
    def strip(layer):
        return dataclasses.replace(layer, selective_saved_bytes=None, children=tuple(map(strip, layer.children)))
    return dataclasses.replace(prof, layers=tuple(map(strip, prof.layers)))


def sac_sweep(*, count: int, time_limit: float) -> None:
    from shardsched.tradeoff.sweep import mix_label
    for key, (cfg, world, gpn, dev, mb, seq) in SAC.items():
        prof = analytic_profile(cfg, micro_batch=mb, seq=seq, device=DEVICES[dev])
        cl = Cluster(world=world, gpus_per_node=gpn, device=DEVICES[dev])
        kw = dict(pins={}, precision=Precision.BF16_MIXED, optimizer=Optimizer.ADAM)
        lo = min(Evaluator(p).peak(least_memory(p._replace(checkpointable=True)))
                 for p in candidate_problems(prof, cl, **kw))
        hi = min(s.peak for s in uniform_baselines(prof, cl, **kw) if not s.name.endswith("+ckpt"))
        print(f"\n{key}: auto with whole-layer checkpointing only vs auto allowed selective (step seconds)")
        print(f"{'budget GiB':>10} {'whole-layer':>12} {'selective':>10} {'gain':>7}  selective plan's mix")
        gains = []
        for k in range(count):
            b = int(lo * (hi / lo) ** (k / max(1, count - 1)))
            t_full, _, _ = row(_whole_layer_only(prof), cl, b, time_limit=time_limit)
            t_sac, _, plan = row(prof, cl, b, time_limit=time_limit)
            sac = sum(u.checkpoint is Checkpoint.SELECTIVE for u in plan.units)
            gains.append(t_full / t_sac)
            print(f"{b / GiB:10.2f} {t_full:12.4f} {t_sac:10.4f} {t_full / t_sac:7.3f}  {mix_label(plan)}, {sac} selective")
        print(f"gain of selective over whole-layer checkpointing: max {max(gains):.3f}x, "
              f"never slower: {all(g >= 1 - 1e-9 for g in gains)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", type=int, default=12)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--only", choices=["single", "multi", "batch", "sac"], default=None,
                    help="only the original sweep, only the multi-node one, only the global-batch one, "
                         "or only the selective-checkpointing one")
    args = ap.parse_args()
    if args.only == "sac":
        return sac_sweep(count=min(args.budgets, 6), time_limit=args.time_limit)
    if args.only == "batch":
        return batch_sweep(time_limit=args.time_limit)
    if args.only != "single":
        results = [multi_node(key, count=args.budgets, time_limit=args.time_limit) for key in MULTI_NODE]
        never_worse, gain = all(r[0] for r in results), max(r[1] for r in results)
        print(f"\nmulti-node (issue 10): auto <= every fitting uniform configuration everywhere: {never_worse}; "
              f"best speedup over the best old uniform strategy: {gain:.3f}x (target >= 1.5x): "
              f"{'PASS' if never_worse and gain >= 1.5 else 'FAIL'}")
    if args.only == "multi":
        return
    for key in CONFIGS:
        prof, cl = setup(key)
        print(f"\n{key}  (auto / baseline step time; '-' = does not fit)")
        print(f"{'budget GiB':>10} {'auto s':>9} {'replicate':>10} {'shard_grad_op':>14} {'full_shard':>11}"
              f" {'auto/best':>10} {'solver':>22} {'plan s':>7}")
        for b in budget_sweep(prof, cl, count=args.budgets):
            t0 = time.perf_counter()
            t, base, plan = row(prof, cl, b, time_limit=args.time_limit)
            fit = [v for v in base.values() if v is not None]
            cells = [f"{t / base[k]:.3f}" if base[k] else "-" for k in ("replicate", "shard_grad_op", "full_shard")]
            best = f"{t / min(fit):.3f}" if fit else "-"
            solver = f"{plan.solver.name}/{plan.solver.status[:12]}"
            print(f"{b / GiB:10.2f} {t:9.4f} {cells[0]:>10} {cells[1]:>14} {cells[2]:>11} {best:>10} "
                  f"{solver:>22} {time.perf_counter() - t0:7.2f}")
    if args.only is None:
        batch_sweep(time_limit=args.time_limit)
        sac_sweep(count=min(args.budgets, 6), time_limit=args.time_limit)


if __name__ == "__main__":
    main()
