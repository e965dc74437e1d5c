"""Everything `shardsched train` can check before a worker starts or a file is written.

Flags (argparse lets through empty strings, NaN, 0 workers per node, ...), the
saved config of a resumed run, the merged TrainConfig (types and ranges, since
config.json is a file anybody may have edited), the data, the plan, the
checkpoint to resume and the run directory. Every problem is one UsageError
line; nothing here writes.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from shardsched._flags import MAX_SEED, check_int, check_positive_float, flag, layers_items, reject_empty_strings
from shardsched._json import loads_strict
from shardsched._paths import check_run_dir
from shardsched.errors import UsageError
from shardsched.train.config import TrainConfig, user_sized

MAX_STEPS = 10**9
MAX_SIZE = 1 << 20
"""Upper bound on --batch, --seq and --nproc: far above what one run can hold."""
MAX_LR = 1e3
_CONFIG_TYPES = {"steps": int, "seed": int, "model": str, "data": (str, type(None)), "batch": int, "seq": int,
                 "lr": (int, float), "eval_every": int, "checkpoint_every": int, "precision": str,
                 "micro_batch": (int, type(None)), "grad_sync": (str, type(None))}
_PRECISIONS = ("fp32", "bf16-mixed")


def check_train_args(args: argparse.Namespace) -> None:
    """The flags as typed (before saved values and defaults fill the gaps)."""
    reject_empty_strings(args)
    check_int("nproc", getattr(args, "nproc", None), lo=1, hi=MAX_SIZE)
    if getattr(args, "run_dir", None) is not None:
        check_run_dir(args.run_dir)
    if getattr(args, "resume", None) is not None and not Path(args.resume).is_dir():
        raise UsageError(f"--resume {args.resume}: no such directory; accepted: a run directory "
                         f"or one of its checkpoints/step_NNNNNN")


def check_user_model_shape(args: argparse.Namespace) -> None:
    """--batch / --seq with a `python:` model: its example inputs and batch_fn make every
    batch, so the flags would change nothing; refused in one line rather than ignored.
    Called once the function itself passed its checks (a wrong function is the first thing to say)."""
    model = getattr(args, "model", None) or ""
    given = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k in ("batch", "seq", "micro_batch")
             if getattr(args, k, None) is not None]
    if user_sized(model) and given and not getattr(args, "sync", None):
        raise UsageError(f"{' '.join(given)}: {model} makes its own inputs (example_inputs, batch_fn), so "
                         f"{'they' if len(given) > 1 else 'it'} would change nothing; accepted: leave "
                         f"{'them' if len(given) > 1 else 'it'} out, size the inputs in your function")


def run_dir_of(resume: str) -> Path:
    """The run directory of --resume (a run directory, or a checkpoint in one)."""
    path = Path(resume)
    return path.parent.parent if path.parent.name == "checkpoints" else path


def read_saved_config(resume: str | None, *, model: str | None) -> dict:
    """config.json of the run to resume: an error when missing, unreadable or
    malformed (never a silent fall-back to defaults). Its `python:` model spec is
    used only if --model names the same spec again: a run directory must never
    make us import code (see models/spec.py, [Note: python: runs the user's code])."""
    if not resume:
        return {}
    path = run_dir_of(resume) / "config.json"
    if not os.path.lexists(path):
        return {}  # a checkpoint copied without its run directory: flags and defaults apply
    try:
        saved = loads_strict(path.read_bytes())
    except OSError as e:
        raise UsageError(f"--resume {resume}: cannot read {path} ({e.strerror}); "
                         f"accepted: a run directory written by `shardsched train`") from None
    except ValueError as e:
        raise UsageError(f"--resume {resume}: {path} is {e}; accepted: the config.json `shardsched train` writes") \
            from None
    if not isinstance(saved, dict):
        raise UsageError(f"--resume {resume}: {path} is not a JSON object; accepted: the config.json "
                         f"`shardsched train` writes")
    for key, types in _CONFIG_TYPES.items():
        if key in saved and (not isinstance(saved[key], types) or isinstance(saved[key], bool)):
            raise UsageError(f"--resume {resume}: {path} has {key}={saved[key]!r:.40}, of the wrong type")
    if not isinstance(saved.get("choose_batch", False), bool):  # the one boolean the flags save
        raise UsageError(f"--resume {resume}: {path} has choose_batch={saved['choose_batch']!r:.40}, of the wrong type")
    spec = saved.get("model")
    if isinstance(spec, str) and spec.startswith("python:") and model != spec:
        raise UsageError(f"--resume {resume}: the run used --model {spec}, which imports and runs code; give "
                         f"--model {spec} again to run it")
    return saved


def check_config(cfg: TrainConfig) -> None:
    """Types and ranges of the merged config (flags, saved config.json, defaults)."""
    for name, types in _CONFIG_TYPES.items():
        value = getattr(cfg, name)
        if not isinstance(value, types) or isinstance(value, bool):
            raise UsageError(f"{flag(name)} has the wrong type ({type(value).__name__})")
    check_int("steps", cfg.steps, lo=1, hi=MAX_STEPS)
    check_int("seed", cfg.seed, lo=0, hi=MAX_SEED)
    check_int("batch", cfg.batch, lo=1, hi=MAX_SIZE)
    check_int("seq", cfg.seq, lo=1, hi=MAX_SIZE)
    if cfg.micro_batch is not None:
        check_int("micro_batch", cfg.micro_batch, lo=1, hi=MAX_SIZE)
    check_int("checkpoint_every", cfg.checkpoint_every, lo=0, hi=MAX_STEPS)
    check_int("eval_every", cfg.eval_every, lo=0, hi=MAX_STEPS)
    if cfg.gpus_per_node is not None:
        check_int("gpus_per_node", cfg.gpus_per_node, lo=1, hi=MAX_SIZE)
    check_positive_float("lr", cfg.lr, hi=MAX_LR)
    if cfg.precision not in _PRECISIONS:
        raise UsageError(f"--precision {cfg.precision!r}: accepted {', '.join(_PRECISIONS)}")
    if cfg.layers is not None:
        layers_items(cfg.layers)


class Validated(NamedTuple):
    """What `validate` checked, for the parent to plan with before any worker starts."""

    cfg: TrainConfig
    """The config, with the checkpoint to resume from resolved."""
    built: Any
    """`train.task.Built`: the model as built here, its forward run once."""
    plan: Any
    """The --plan read and checked against the model, or None when the run plans."""


def validate(cfg: TrainConfig, *, world: int) -> Validated:
    """Check everything checkable before workers start (messages about skipped
    checkpoints printed here)."""
    from shardsched.plan.spec import parse_strategy_spec
    from shardsched.train import checkpoint as ckpt
    from shardsched.train.planning import load_plan, run_device
    from shardsched.train.task import check_task
    check_config(cfg)
    check_run_dir(cfg.run_dir)
    if cfg.plan is None:
        parse_strategy_spec(cfg.strategy or "auto")
    run_device(cfg)  # a bad --cluster file is one line here
    built, task = check_task(cfg, world=world)  # the model builds, its data loads, its loss is a scalar
    if cfg.layers is not None:
        from shardsched.profile.layers import resolve_spec
        resolve_spec(built.model, cfg.layers)  # every --layers item names a module of this model
    plan = load_plan(cfg.plan, model=built.model, world=world) if cfg.plan else None
    if plan is not None:
        check_plan_order(plan, built.model, task.train_batch(0, 0, world), path=cfg.plan)
    check_accumulation(cfg, plan, world=world)
    if cfg.resume:
        found = ckpt.find_checkpoint(cfg.resume, log=lambda m: print(m, file=sys.stderr))
        cfg = dataclasses.replace(cfg, resume=str(found))
    if cfg.gpus_per_node is not None and world % cfg.gpus_per_node:
        raise UsageError(f"--gpus-per-node {cfg.gpus_per_node} must divide the world {world} "
                         f"(accepted: a divisor, e.g. 2 for 4 workers as 2 nodes of 2)")
    check_run_dir_is_free(cfg)
    for note in task.notes:  # only once the input is good: an error stays one line
        print(f"note: {note}", file=sys.stderr)
    return Validated(cfg=cfg, built=built, plan=plan)


def execution_order(model, inputs: tuple) -> dict[str, int]:
    """Module path -> when its forward first ran, on one forward of `inputs` (no grad)."""
    import torch
    names, seen = {id(m): n for n, m in model.named_modules()}, {}

    def pre(module, args):
        name = names.get(id(module))
        if name is not None:
            seen.setdefault(name, len(seen))
    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        handle.remove()
    return seen


def check_plan_order(plan, model, inputs: tuple, *, path: str) -> None:
    """A --plan lists its layers in the order the model runs them, as `plan` writes them
    and as its prefetches and predictions assume (`plan --plan` checks the same against its
    profile). Registration order can differ from execution order, so the model runs once;
    the root ("") and modules its forward never calls are not ordered."""
    from shardsched.plan.validate import ACCEPTED
    order = execution_order(model, inputs)
    flat = [layer for u in plan.units for layer in u.layers if layer and layer in order]
    for a, b in zip(flat, flat[1:]):
        if order[b] < order[a]:
            raise UsageError(f"--plan {path} lists layer {b!r} after {a!r}, out of the order the model runs "
                             f"them; {ACCEPTED}")


def check_accumulation(cfg: TrainConfig, plan, *, world: int) -> None:
    """The global batch splits into workers x micro-batches (with --plan: the plan's choice)."""
    from shardsched.runtime.accum import resolve
    if user_sized(cfg.model):
        return
    resolve(batch=cfg.batch, world=world, micro_batch=cfg.micro_batch, grad_sync=cfg.grad_sync, plan=plan)


def check_run_dir_is_free(cfg: TrainConfig) -> None:
    """A new run must not mix its checkpoints with another run's: a good old
    checkpoint is never overwritten, so the new one would silently be lost."""
    from shardsched.train.checkpoint import checkpoint_dir
    existing = sorted(checkpoint_dir(cfg.run_dir).glob("step_*")) if checkpoint_dir(cfg.run_dir).is_dir() else []
    resumed_here = cfg.resume and Path(cfg.resume).resolve().parent.parent == Path(cfg.run_dir).resolve()
    if existing and not resumed_here:
        raise UsageError(f"{cfg.run_dir} already holds checkpoints of another run; "
                         f"continue it with --resume {cfg.run_dir} or pick another --run-dir")
