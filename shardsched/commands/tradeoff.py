"""`shardsched tradeoff`: sweep budgets; print the table, write --csv and --png."""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import textwrap
from pathlib import Path

from rich.table import Table

from shardsched._flags import add_headroom_argument, add_layers_argument, layers_items
from shardsched.cost.headroom import headroom_for, usable_budget
from shardsched._fmt import console, fmt_bytes, fmt_seconds
from shardsched.errors import UsageError
from shardsched.models.spec import parse_model_spec
from shardsched.core.types import Precision
from shardsched._paths import atomic_write
from shardsched.commands.plan import cluster_from_args
from shardsched.profile.resolve import profiled
from shardsched.tradeoff.sweep import auto_budgets, csv_text, mix_label, parse_budgets, sweep

DEFAULT_POINTS = 12


def add_tradeoff_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--model", default="gpt2", help="preset, gpt:key=value,... or python:module:function (default gpt2)")
    add_layers_argument(p)
    a("--world", type=int, default=8, help="data-parallel workers (default 8)")
    a("--gpus-per-node", type=int, default=None, help="workers per node; must divide --world (default min(8, world))")
    a("--device", default=None, help="device preset (default h100; cpu for python: models)")
    a("--micro-batch", type=int, default=1, help="sequences per worker per step (default 1)")
    a("--seq", type=int, default=None, help="tokens per sequence (default: the model's)")
    a("--precision", choices=[p.value for p in Precision], default=None,
      help="fp32 or bf16-mixed (default bf16-mixed on GPUs, fp32 on cpu)")
    a("--optimizer", choices=["adam", "sgd"], default="adam")
    a("--budgets", default=None, help="LO:HI:N, e.g. 16GiB:80GiB:12 (default: N=12 from the least-memory plan "
                                      "to where every uniform configuration fits)")
    add_headroom_argument(p)
    a("--time-limit", type=float, default=None,
      help="safety cut-off in seconds for each auto plan (default none; see `plan --time-limit`)")
    a("--csv", default=None, help="write one row per budget: composition and every configuration's step time")
    a("--png", default=None, help="write the figure: step time vs budget, one line per configuration")
    a("--measure", action="store_true", help="profile a preset by running it on this machine")
    a("--no-verify", action="store_true", help="skip running each auto plan once under FSDP2 on fake tensors "
                                              "(see `plan --no-verify`)")
    a("--wide", action="store_true", help="one column per uniform configuration (default: 80 columns, the best "
                                          "uniform one per budget)")


def _check_out(flag: str, path: str | None) -> None:
    if path and str(Path(path).parent) not in ("", ".") and not Path(path).parent.is_dir():
        raise UsageError(f"{flag} {path}: directory {Path(path).parent} does not exist; accepted: a path in an "
                         f"existing directory")


def run_tradeoff(args: argparse.Namespace) -> int:
    if args.layers is not None:
        layers_items(args.layers)  # its syntax; whether it names modules, once the model is built
    spec = parse_model_spec(args.model)
    cluster = cluster_from_args(args, python_model=spec.config is None)
    budgets = parse_budgets(args.budgets) if args.budgets else None
    headroom = headroom_for(args.headroom, cluster.device)
    if budgets:  # planned at what is left of each budget once --headroom is taken off
        budgets = [usable_budget(b, device_memory=cluster.device.memory_bytes, headroom=headroom).usable
                   for b in budgets]
    _check_out("--csv", args.csv)
    _check_out("--png", args.png)
    precision = Precision(args.precision or ("fp32" if cluster.device.name == "cpu" else "bf16-mixed"))
    built = profiled(spec, micro_batch=args.micro_batch, seq=args.seq, device=cluster.device,
                     precision=precision, measure=args.measure, layers=args.layers)
    profile = built.profile
    kw = dict(precision=precision, optimizer=_opt(args.optimizer))
    budgets = budgets or auto_budgets(profile, cluster, n=DEFAULT_POINTS, **kw)
    points = sweep(profile, cluster, budgets, time_limit=args.time_limit or math.inf, **kw)
    if not args.no_verify:
        points = verified_points(points, spec, built, args.layers, cluster=cluster, kw=kw)
    if args.csv:
        atomic_write(args.csv, csv_text(points, cluster))
    if args.png:
        from shardsched.tradeoff.plot import tradeoff_png
        _png_atomic(args.png, points, title=f"{profile.model}: {cluster.world} x {cluster.device.name}, "
                                            f"{cluster.gpus_per_node} per node")
    print(f"budget column: the usable budget, each --budgets value less --headroom {headroom.text}" if args.budgets
          else "budget column: usable budgets from the least-memory plan's peak up (no --headroom comes off "
               "budgets derived from the model)")
    if args.wide:
        console(wide=True).print(table(points))  # one column per uniform configuration: ~200 columns
    else:
        console().print(narrow_table(points))
    print(textwrap.fill(verified_words(points, profile), width=80))
    return 0


def verified_points(points, spec, built, layers: str | None, *, cluster, kw: dict):
    """Each auto plan of the sweep run once under FSDP2 on fake tensors and, when its verified
    peak is over its budget (or well under its prediction), planned again as `plan` does
    ([Note: the closed loop]); a budget where nothing verified fits reads "none fits". The
    answers then keep the sweep's monotone rule: a budget never gets a slower plan than a
    smaller budget's, which fits it too."""
    from shardsched.errors import UsageError
    from shardsched.profile.resolve import build_model
    from shardsched.solve.build import make_plan
    from shardsched.verify.loop import closed_loop
    from shardsched.verify.subject import Subject, Unverifiable, verifier

    def build(*, micro_batch: int, seq: int | None, real: bool):
        return build_model(spec, micro_batch=micro_batch, seq=seq, measure=real, layers=layers)
    verify = verifier(Subject(built.model, built.inputs, build))

    def replan(b: int, *, selective: bool = True):  # [Note: a plan the engine cannot run] in verify/loop.py
        return make_plan(built.profile if selective else built.profile.without_selective(), cluster, strategy="auto", memory_budget_bytes=b, **kw)
    out, best = [], None
    for p in points:
        auto = p.auto
        if auto is not None:
            try:
                auto = closed_loop(auto, verify=verify, replan=replan, usable=p.budget,
                                   analytic=built.profile.source == "analytic")
            except Unverifiable:
                pass
            except UsageError:  # nothing verified fits this budget
                auto = None
        if best is not None and (auto is None or best.predicted.step_seconds < auto.predicted.step_seconds):
            auto = best  # verified to fit a smaller budget
        best = auto if auto is not None and auto.verified is not None else best
        out.append(p._replace(auto=auto))
    return out


def verified_words(points, profile) -> str:
    """One line: how the auto plans' verified peaks stand against their predictions and budgets."""
    checked = [p for p in points if p.auto and p.auto.verified]
    if not checked:
        return "auto plans: not verified (--no-verify)"
    over = [p for p in checked if p.auto.verified.peak_bytes > p.budget]
    worst = max(checked, key=lambda p: abs(p.auto.verified.peak_bytes / p.auto.predicted.peak_bytes - 1))
    err = worst.auto.predicted.peak_bytes / worst.auto.verified.peak_bytes - 1
    kernels = " (CPU kernels: a GPU's fused kernels save less)" if profile.source == "analytic" and \
        profile.extra.get("device", "cpu") != "cpu" else ""
    return (f"auto plans verified by FSDP2 on fake tensors{kernels}: {len(checked)}, predicted within "
            f"{abs(err):.1%} of verified; {len(over)} over their budget" + (" (marked *)" if over else ""))


def _opt(name: str):
    from shardsched.core.types import Optimizer
    return Optimizer(name)


def _png_atomic(path: str, points, *, title: str) -> None:
    from shardsched.tradeoff.plot import tradeoff_png
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.",
                               suffix=".png")
    os.close(fd)
    try:
        tradeoff_png(tmp, points, title=title)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# Short headers so that the uniform columns (each strategy; none, +ckpt, +sac) fit; the CSV keeps the full names.
SHORT = {"replicate": "DDP", "shard_grad_op": "ZeRO-2", "full_shard": "ZeRO-3", "full_shard/node": "Z3/node",
         "hybrid_shard": "HSDP", "hybrid_shard_grad_op": "HSDP-Z2"}


def short_name(name: str) -> str:
    for suffix, short in (("+ckpt", "+ck"), ("+sac", "+sa")):
        if name.endswith(suffix):
            base = name.removesuffix(suffix)
            return SHORT.get(base, base) + short
    return SHORT.get(name, name)


def best_uniform(p) -> tuple[str, float] | None:
    """(name, seconds) of the fastest uniform configuration that fits this budget."""
    fits = [(p.uniform[n].seconds, n) for n in p.uniform if p.fits(n)]
    return (min(fits)[1], min(fits)[0]) if fits else None


def narrow_table(points) -> Table:
    """80 columns: per budget the automatic plan, the best uniform configuration that
    fits, and how much faster the plan is (`--wide` shows every configuration)."""
    from rich import box
    t = Table(title="predicted step time by per-worker budget (--wide: every configuration)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              caption="DDP replicate, ZeRO-2/3 shard_grad_op/full_shard, HSDP hybrid_shard, +ck checkpointing",
              caption_justify="left")
    for col in ("budget", "auto", "best uniform", "speedup", "auto mix"):
        t.add_column(col, justify="left" if col in ("best uniform", "auto mix") else "right",
                     no_wrap=col != "auto mix", overflow="fold")
    for p in points:
        auto, best = p.auto.predicted.step_seconds if p.auto else None, best_uniform(p)
        gain = f"{best[1] / auto:.2f}x" if auto and best else "-"
        t.add_row(fmt_bytes(p.budget), fmt_seconds(auto) + ("*" if _over(p) else ""),
                  f"{short_name(best[0])} {fmt_seconds(best[1])}" if best else "none fits", gain, mix_label(p.auto))
    return t


def _over(p) -> bool:
    """The auto plan's verified peak is over its budget (`verified_words` says so too)."""
    return bool(p.auto and p.auto.verified and p.auto.verified.peak_bytes > p.budget)


def table(points) -> Table:
    t = Table(title="predicted step time by per-worker budget (- : does not fit)", title_justify="left",
              caption="DDP replicate, ZeRO-2 shard_grad_op, ZeRO-3 full_shard, Z3/node full_shard within a node, "
                      "HSDP hybrid_shard, +ck activation checkpointing", caption_justify="left")
    names = list(points[0].uniform)
    for col in ("budget", "auto", "auto mix", *map(short_name, names)):
        t.add_column(col, justify="left" if col == "auto mix" else "right", no_wrap=col != "auto mix",
                     min_width=9 if col != "auto mix" else 20)
    for p in points:
        best = p.auto.predicted.step_seconds if p.auto else None
        t.add_row(fmt_bytes(p.budget), fmt_seconds(best), mix_label(p.auto),
                  *[fmt_seconds(p.uniform[n].seconds) if p.fits(n) else "-" for n in names])
    return t
