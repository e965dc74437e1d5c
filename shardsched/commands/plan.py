"""`shardsched plan`: model spec + cluster + strategy -> a Plan, printed or saved."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from shardsched._fmt import fmt_bytes
from shardsched.commands.plan_profile import profile_or_refuse, sized_spec
from shardsched.cost.bytes import parse_bytes
from shardsched.cost.device import DEVICES, Cluster, read_cluster_file
from shardsched.cost.headroom import Budget, headroom_for, stated, usable_budget
from shardsched.errors import UsageError
from shardsched.solve.build import make_plan, plan_from_scenario
from shardsched.plan.schedule import scenario_for
from shardsched.plan.units import tied_violation
from shardsched.core.types import GradSync, Optimizer, Plan, Precision
from shardsched._flags import (add_headroom_argument, add_layers_argument, check_int, check_positive_float, flag,
                               layers_items, reject_empty_strings)
from shardsched._paths import atomic_write, check_writable_file
from shardsched.plan.spec import parse_strategy_spec
from shardsched.plan.validate import check_plan_layers, read_plan_file
from shardsched.models.spec import PRESETS, parse_model_spec


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--model", default="gpt2", help=f"preset ({', '.join(PRESETS)}), gpt:key=value,..., "
                                      "python:module:function or hf:<config.json | model type | checkpoint name>"
                                      "[,key=value...] (default gpt2); python: imports that module and runs that "
                                      "function in this process: use it only with code you trust")
    add_layers_argument(p)
    a("--world", type=int, default=8, help="data-parallel workers (default 8)")
    a("--gpus-per-node", type=int, default=None, help="workers per node; must divide --world (default min(8, world))")
    a("--device", default=None, help=f"device preset: {', '.join(DEVICES)} (default h100; cpu for python: models)")
    a("--cluster", default=None, help="cluster file from `shardsched profile --out`: replaces the --device preset")
    a("--micro-batch", type=int, default=None, help="sequences per worker per step (default 1; with --plan: the plan's; "
                                                    "python: models take it only as a micro_batch= argument)")
    a("--seq", type=int, default=None, help="tokens per sequence (default: the model's; hf: at most 4096, the plan "
                                            "notes why; with --plan: the plan's)")
    a("--precision", choices=[p.value for p in Precision], default=None,
      help="fp32 or bf16-mixed (default bf16-mixed on GPUs, fp32 on cpu)")
    a("--optimizer", choices=[o.value for o in Optimizer], default="adam")
    a("--strategy", default=None, help="replicate | shard_grad_op | full_shard | auto, with overrides like "
                                       "'full_shard,blocks.0-3=replicate' (default full_shard; auto with --memory-budget)")
    a("--memory-budget", default=None, help="per-worker budget, e.g. 40GiB")
    add_headroom_argument(p)
    a("--plan", default=None, help="re-evaluate an existing plan.json for this model and cluster")
    a("--measure", action="store_true", help="time the model on this machine instead of tracing it on fake tensors "
                                             "(min of repeats, cached by fingerprint)")
    a("--no-fuse", action="store_true", help="one unit per layer (no block-size fusion)")
    a("--time-limit", type=float, default=None,
      help="safety cut-off in seconds for the auto planner (default none): its work limit, not the clock, decides "
           "the plan; a run this cuts short says so in its status and may differ between machines (it makes one "
           "search at the budget, as --one-search)")
    a("--global-batch", type=int, default=None,
      help="rows per optimizer step across all workers: the planner also chooses the micro-batch (a divisor of "
           "global-batch/world, unless --micro-batch is given) and the accumulation steps and --grad-sync mode, "
           "fastest per global batch under the budget")
    a("--grad-sync", choices=[g.value for g in GradSync], default=None,
      help="with --global-batch: reduce gradients after every micro-batch or only the last (default: the planner's choice)")
    a("--max-batch", action="store_true",
      help="print the largest micro-batch that fits --memory-budget (default: device memory) under each uniform "
           "strategy and under auto, then exit")
    a("--one-search", action="store_true",
      help="auto: one search at the budget instead of the budget ladder (the default: searches at fixed budgets "
           "x2 apart from the least-memory figure, ascended toward the next, and the exact optima of small "
           "groupings, so a larger budget never gets a slower plan across separate runs); one search can be "
           "faster at one budget, and slower at a larger one")
    a("--monotone", action="store_true", help=argparse.SUPPRESS)  # the default since issue 27's ladder
    a("--no-verify", action="store_true",
      help="skip running the plan once under FSDP2 on fake tensors before it is returned (the plan then says it "
           "is unverified, and auto plans are fitted to the prediction alone)")
    a("--json", action="store_true", help="print the plan as JSON instead of tables")
    a("--wide", action="store_true", help="every column and every unit (default: 80 columns, identical units folded)")
    a("--out", default=None, help="also write the plan JSON to this file")
    a("--trace", default=None, help="write the simulated step as a Chrome trace (chrome://tracing, Perfetto)")
    a("--png", default=None, help="draw the simulated step: compute and communication lanes, memory and budget")


def cluster_from_args(args: argparse.Namespace, *, python_model: bool) -> Cluster:
    if args.world < 1:
        raise UsageError(f"--world must be >= 1, got {args.world}")
    gpn = args.gpus_per_node or min(8, args.world)
    if gpn < 1 or args.world % min(gpn, args.world):
        raise UsageError(f"--gpus-per-node {gpn} must divide --world {args.world} (e.g. 8 for world 64)")
    if getattr(args, "cluster", None):
        return Cluster(world=args.world, gpus_per_node=gpn, device=read_cluster_file(args.cluster))
    name = args.device or ("cpu" if python_model else "h100")
    if name not in DEVICES:
        raise UsageError(f"unknown device {name!r}; accepted: {', '.join(DEVICES)}")
    return Cluster(world=args.world, gpus_per_node=gpn, device=DEVICES[name])


MAX_WORLD = 1 << 20
"""Upper bound on --world (and per-node workers, micro-batch, seq): far above any
cluster, low enough that the planner's arithmetic stays fast."""


def check_plan_flags(args: argparse.Namespace) -> None:
    """Everything argparse lets through that no plan can mean (one line, exit 2)."""
    reject_empty_strings(args)
    if args.world < 1:
        raise UsageError(f"--world must be >= 1, got {args.world}")
    check_int("world", args.world, lo=1, hi=MAX_WORLD)
    check_int("gpus_per_node", args.gpus_per_node, lo=1, hi=MAX_WORLD)
    check_int("micro_batch", args.micro_batch, lo=1, hi=MAX_WORLD)
    check_int("seq", args.seq, lo=1, hi=MAX_WORLD)
    check_int("global_batch", getattr(args, "global_batch", None), lo=1, hi=MAX_WORLD)
    if getattr(args, "global_batch", None) and args.plan:
        raise UsageError("--global-batch with --plan: the plan already fixed its micro-batch; accepted: one of them")
    if getattr(args, "grad_sync", None) and not getattr(args, "global_batch", None):
        raise UsageError(f"--grad-sync {args.grad_sync} needs --global-batch N (accumulation needs a global batch)")
    check_positive_float("time_limit", args.time_limit)
    if args.layers is not None:
        layers_items(args.layers)
    for name in ("out", "trace", "png"):
        if getattr(args, name, None) is not None:
            check_writable_file(getattr(args, name), flag(name))
    if args.out and args.trace and Path(args.out).resolve() == Path(args.trace).resolve():
        raise UsageError(f"--out and --trace name the same file {args.out}; accepted: two different paths")


def run_plan(args: argparse.Namespace) -> int:
    check_plan_flags(args)
    spec = parse_model_spec(args.model)
    cluster = cluster_from_args(args, python_model=spec.config is None)
    precision = Precision(args.precision or ("fp32" if cluster.device.name == "cpu" else "bf16-mixed"))
    given = parse_bytes(args.memory_budget) if args.memory_budget else None
    existing = read_plan_file(args.plan) if args.plan else None  # validate input before any work
    if given is None and existing is not None:
        given = existing.memory_budget_bytes  # re-evaluated under the budget it was made for
    budget = usable_budget(given, device_memory=cluster.device.memory_bytes,
                           headroom=headroom_for(args.headroom, cluster.device))
    if getattr(args, "max_batch", False):
        from shardsched.commands.plan_batch import print_max_batch
        return print_max_batch(args, spec, cluster, precision, budget.usable)
    if getattr(args, "global_batch", None):
        from shardsched.commands.plan_batch import global_batch_plan
        plan, profile = global_batch_plan(args, spec, cluster, precision, budget.usable if given is not None else None)
        plan = _verified(args, stated(plan, budget), spec, profile, None, replan=None,
                         usable=budget.usable if given is not None else None)
        return _finish(args, plan, profile, cluster, budget, given, spec, args.seq)
    micro_batch, seq = _shape(args, existing)
    sized = sized_spec(spec, micro_batch=args.micro_batch, seq=args.seq)
    built = profile_or_refuse(sized, micro_batch, seq, args, cluster, precision)
    profile, replan, usable = built.profile, None, budget.usable if given is not None else None
    if existing is not None:
        plan = reevaluate(existing, profile, cluster, budget)
    else:
        strategy = args.strategy or ("auto" if given else "full_shard")
        # Headroom is taken off before the planner sees the budget; without one, auto fills the
        # device's memory less the headroom, and a named strategy is planned with no budget.
        auto = parse_strategy_spec(strategy).auto
        planned = budget.usable if given is not None or auto else None

        def replan(b: int | None, *, selective: bool = True) -> Plan:
            # selective=False: [Note: a plan the engine cannot run] in verify/loop.py
            space = profile if selective else profile.without_selective()
            return stated(make_plan(space, cluster, strategy=strategy, precision=precision, optimizer=args.optimizer,
                                    memory_budget_bytes=b, fuse=not args.no_fuse,
                                    time_limit=args.time_limit or math.inf,
                                    one_search=getattr(args, "one_search", False)), budget)
        plan, usable, replan = replan(planned), planned, (replan if auto else None)
    plan = _verified(args, plan, sized, profile, built, replan=replan, usable=usable)
    return _finish(args, plan, profile, cluster, budget, given, spec, seq)


def _verified(args: argparse.Namespace, plan: Plan, spec, profile, built, *, replan, usable: int | None) -> Plan:
    """`plan` run once by the engine and, for auto, planned again until its verified peak
    fits (`verify.loop`, [Note: the closed loop]); `--no-verify` says it is not."""
    from shardsched.profile.resolve import build_model
    from shardsched.verify.loop import checked_plan
    from shardsched.verify.subject import Subject

    def build(*, micro_batch: int, seq: int | None, real: bool):
        return build_model(spec, micro_batch=micro_batch, seq=seq, measure=real, layers=args.layers)
    subject = Subject(built.model if built else None, built.inputs if built else (), build)
    return checked_plan(plan, subject=subject, replan=replan, usable=usable,
                        analytic=profile.source == "analytic", enabled=not getattr(args, "no_verify", False))


def _finish(args: argparse.Namespace, plan: Plan, profile, cluster: Cluster, budget, given: int | None, spec,
            seq: int | None) -> int:
    """Notes, warnings, then the plan written, traced, drawn and printed as the flags say.
    `budget`: the usable budget (`cost.headroom.usable_budget`); `given`: --memory-budget."""
    # What was set on the model for training (e.g. HF use_cache=False), said in the plan.
    plan = dataclasses.replace(plan, notes=plan.notes + tuple(profile.extra.get("notes", ())))
    if seq is None and spec.seq_note:
        plan = dataclasses.replace(plan, notes=plan.notes + (spec.seq_note,))
    if given is not None and plan.predicted.peak_bytes > budget.usable:
        # Reported, never silently accepted: the plan is still shown (and saved) for inspection.
        sys.stderr.write(f"shardsched plan: warning: predicted peak {fmt_bytes(plan.predicted.peak_bytes)} exceeds "
                         f"the usable budget {fmt_bytes(budget.usable)} (--memory-budget {fmt_bytes(given)} less "
                         f"{fmt_bytes(budget.headroom_bytes)} --headroom); try --strategy auto\n")
    if given is not None and plan.verified is not None and plan.verified.peak_bytes > budget.usable:
        cpu_program = profile.source == "analytic" and plan.device != "cpu"
        kernels = " on CPU kernels (GPU kernels save less)" if cpu_program else ""
        advice = "try --strategy auto" if plan.solver.name in ("uniform", "manual") else \
            ("the prediction prices the GPU's kernels ([Note: what the CPU verifies of a GPU plan])" if cpu_program
             else "try a larger --memory-budget")
        sys.stderr.write(f"shardsched plan: warning: verified peak {fmt_bytes(plan.verified.peak_bytes)}{kernels} "
                         f"exceeds the usable budget {fmt_bytes(budget.usable)}; {advice}\n")
    device_memory_warning(plan, cluster)
    if args.out:
        atomic_write(args.out, plan.to_json() + "\n")
    if args.trace:
        write_trace_for(args.trace, plan, profile, cluster)
        # stderr: stdout may be the plan JSON itself
        sys.stderr.write(f"shardsched plan: wrote the simulated step to {args.trace} "
                         "(open it in https://ui.perfetto.dev or chrome://tracing)\n")
    if args.png:
        write_png_for(args.png, plan, profile, cluster)
    if args.json:
        sys.stdout.write(plan.to_json() + "\n")
    else:
        from shardsched.plan.report import print_plan
        print_plan(plan, profile, cluster, wide=args.wide)
    return 0


def _shape(args: argparse.Namespace, existing: Plan | None) -> tuple[int, int | None]:
    """(micro-batch, seq or None for the model's own) to profile at: the flags, else what
    the re-evaluated plan assumed (its predictions were made there), else 1 and the model's."""
    micro_batch = args.micro_batch or (existing.micro_batch if existing else 1)
    seq = args.seq or (existing.seq if existing and existing.seq else None)
    return micro_batch, seq


def device_memory_warning(plan: Plan, cluster: Cluster) -> None:
    """One line when the plan cannot fit the named device, whatever the budget says."""
    mem = cluster.device.memory_bytes
    if plan.predicted.peak_bytes > mem:
        sys.stderr.write(f"shardsched plan: warning: predicted peak {plan.predicted.peak_bytes / 2**30:.2f} GiB exceeds "
                         f"the {cluster.device.name}'s {mem / 2**30:.0f} GiB of memory per worker\n")


def planned_budget(plan: Plan) -> int | None:
    """The budget the plan had to fit: the usable one when a budget was given (older plans: the given)."""
    if plan.memory_budget_bytes is None:
        return None
    return plan.usable_budget_bytes or plan.memory_budget_bytes


def reevaluate(plan: Plan, profile, cluster: Cluster, budget: Budget) -> Plan:
    """Predictions of an existing plan under this profile and cluster, and `budget`."""
    if plan.fingerprint != profile.fingerprint:
        raise UsageError(f"plan was made for another model (fingerprint {plan.fingerprint}, this model "
                         f"{profile.fingerprint}); accepted: a plan from `shardsched plan --model` of the same model")
    if plan.world != cluster.world:
        raise UsageError(f"plan was made for world {plan.world}, not {cluster.world}")
    bad = tied_violation([u.layers for u in plan.units], profile.tied)
    if bad:
        raise UsageError(bad)
    check_plan_layers(plan, _layer_order(profile.layers))
    try:
        sc = _exact(plan, profile, cluster) or scenario_for(plan, profile, cluster)
    except (ValueError, KeyError) as e:
        raise UsageError(f"plan does not match the model's layers: {e}") from None
    return stated(plan_from_scenario(sc, profile=profile,
                                     memory_budget_bytes=budget.usable if budget.given is not None else None,
                                     solver=plan.solver, precision=plan.precision, optimizer=plan.optimizer,
                                     notes=plan.notes), budget)


def _exact(plan: Plan, profile, cluster: Cluster):
    """The scenario of the plan's own `strategy_spec` ([Note: exact specs] in plan/spec.py: it
    gives back the plan's units, launches and predictions, split layers included), or None for
    a plan without one or one that accumulates (the spec does not name micro-batches)."""
    if not plan.strategy_spec or plan.accumulation > 1:
        return None
    from shardsched.solve.build import exact_scenario
    return exact_scenario(profile, cluster, parse_strategy_spec(plan.strategy_spec), precision=plan.precision,
                          optimizer=plan.optimizer)


def _layer_order(layers) -> list[str]:
    """Layer names depth-first (a partitioned layer, then its children): execution order."""
    return [n for layer in layers for n in (layer.name, *_layer_order(layer.children))]


def write_png_for(path: str, plan: Plan, profile, cluster: Cluster) -> None:
    """The step picture (`sim.plot`), written via a temporary file and a rename."""
    from shardsched.sim.plot import step_png
    from shardsched.sim.simulate import simulate

    sc = scenario_for(plan, profile, cluster)
    res = simulate(sc)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.")
    os.close(fd)
    try:
        step_png(tmp, sc, res.timeline, res.memory, budget=planned_budget(plan),
                 title=f"{plan.model}: {plan.world} x {plan.device}, step {res.predicted.step_seconds * 1e3:.1f} ms, "
                       f"peak {fmt_bytes(res.predicted.peak_bytes)}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_trace_for(path: str, plan: Plan, profile, cluster: Cluster) -> None:
    from shardsched.sim.simulate import simulate
    from shardsched.sim.trace import trace_events

    sc = scenario_for(plan, profile, cluster)
    res = simulate(sc)
    atomic_write(path, json.dumps({"traceEvents": trace_events(sc, res.timeline, res.memory)}))
