"""The training loop: a model, a plan, FSDP2 via `parallelize`, AdamW, metrics, checkpoints.

`train(cfg, mesh=..., rank=...)` runs on every worker (see `launcher`). What it
trains and each rank's inputs for a step come from `train.task` (the text corpus
for language models, a user's batch function otherwise); the loop only calls
`model(*inputs)` for the loss. For text, the global batch of `cfg.batch` sequences
is split evenly across workers; each worker's loss is the mean over its rows and
FSDP2 averages gradients over the world, so every step applies the global-batch
mean gradient whatever the number of workers. Everything is a function of
`cfg.seed` and the step number.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from shardsched._fmt import fmt_bytes
from shardsched.errors import UsageError
from shardsched.core.types import GradSync, Plan
from shardsched.train import checkpoint as ckpt
from shardsched.train import interrupt
from shardsched.runtime.accum import Accumulation, forward_backward, micro_step, split_micro_batches
from shardsched.runtime.scalars import optimizer_param_groups
from shardsched.train.config import TrainConfig
from shardsched.train.task import Task, build, check_loss, make_task, to_device
from shardsched.train.planning import obtain_plan, share_from_rank0
from shardsched.train.progress import Progress, ProgressMode, default_every, logged_output, progress_mode
from shardsched.train.report import print_summary

MEASURED_STEPS = 2
"""Steps run under FSDPMemTracker on CPU (slow, so only a couple, on a throwaway copy)."""


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    losses: tuple[float, ...]
    """Mean loss over workers of each step run by this call (step start+1 ... steps)."""
    start_step: int
    """Steps already done before this call (non-zero after resume)."""
    summary: dict = field(default_factory=dict)
    """What summary.json holds."""
    model: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    """The trained (sharded) model, for callers that gather or evaluate it."""
    optimizer: torch.optim.Optimizer | None = field(default=None, repr=False, compare=False)
    """Its AdamW, whose state is sharded like the parameters."""


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the model's (sharded or replicated) parameters.

    foreach=True: one multi-tensor kernel per state instead of a Python loop over
    parameters. On DTensors (FSDP2) each loop iteration pays DTensor dispatch;
    measured on 2 gloo workers with the tiny model, the step took 177 ms per-parameter
    and 10.5 ms foreach (PyTorch picks foreach by default only on CUDA). Verification steps
    the same optimizer ([Note: the optimizer verified is the trainer's] in verify/optimizer.py);
    sharded and plain parameters (scalars kept out of sharding) are groups apart, as foreach
    kernels step one kind of tensor at a time."""
    return torch.optim.AdamW(optimizer_param_groups(model), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)


def lr_at(step: int, *, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine from lr down to lr/10 at the last step."""
    warm = min(warmup, max(1, steps // 10))
    if step < warm:
        return lr * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# ---------------------------------------------------------------- the loop

@dataclass
class _Run:
    """Mutable state of one training call on one worker."""

    cfg: TrainConfig
    mesh: DeviceMesh
    rank: int
    device: torch.device
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    task: Task
    plan: Plan
    accum: Accumulation
    losses: list = field(default_factory=list)
    step_seconds: list = field(default_factory=list)


def _mean_over_workers(value: torch.Tensor, mesh: DeviceMesh) -> float:
    # gloo has no AVG reduction: sum, then divide.
    t = value.detach().float().reshape(1).clone()
    dist.all_reduce(t, group=mesh.get_group())
    return t.item() / mesh.size()


def _maybe_fail(rank: int, step: int) -> None:
    """Test hook: SHARDSCHED_TEST_FAIL_RANK / _STEP make one worker die mid-run
    (SHARDSCHED_TEST_FAIL_MODE=kill: by SIGKILL, exit0: exit status 0, else by an exception)."""
    if os.environ.get("SHARDSCHED_TEST_FAIL_RANK") != str(rank):
        return
    if os.environ.get("SHARDSCHED_TEST_FAIL_STEP", "1") != str(step):
        return
    if os.environ.get("SHARDSCHED_TEST_FAIL_MODE") == "kill":
        os.kill(os.getpid(), 9)
    if os.environ.get("SHARDSCHED_TEST_FAIL_MODE") == "exit0":  # leaves quietly, as if done
        os._exit(0)
    raise RuntimeError(f"test failure injected at step {step}")


def _micro_batches(run: _Run, step: int) -> list[tuple]:
    """This worker's rows of global batch `step`, as the run's micro-batches (runtime.accum)."""
    inputs = run.task.train_batch(step, run.rank, run.mesh.size())
    return [to_device(m, run.device) for m in split_micro_batches(inputs, run.accum.steps)]


def _train_step(run: _Run, step: int) -> float:
    """One optimizer step on global batch `step` (accumulated over the run's micro-batches);
    returns the mean loss over workers."""
    cfg = run.cfg
    micro = _micro_batches(run, step)
    for group in run.opt.param_groups:
        group["lr"] = lr_at(step, steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup)
    _maybe_fail(run.rank, step + 1)
    loss = forward_backward(run.model, micro, grad_sync=run.accum.grad_sync,
                            loss_of=lambda out: check_loss(out, cfg.model))
    run.opt.step()
    run.opt.zero_grad(set_to_none=True)
    return _mean_over_workers(loss, run.mesh)


@torch.no_grad()
def evaluate(run: _Run) -> float:
    """Mean validation loss over cfg.eval_batches fixed global batches."""
    cfg, world = run.cfg, run.mesh.size()
    total = torch.zeros((), device=run.device)
    for i in range(cfg.eval_batches):
        total += run.model(*to_device(run.task.eval_batch(i, run.rank, world), run.device))
    return _mean_over_workers(total / cfg.eval_batches, run.mesh)


def _metrics_path(cfg: TrainConfig) -> Path:
    return Path(cfg.run_dir) / "metrics.jsonl"


def _prepare_metrics(cfg: TrainConfig, start_step: int) -> None:
    """Keep the lines of steps already done (resume), drop the rest."""
    path = _metrics_path(cfg)
    kept = []
    if start_step and path.exists():
        kept = [ln for ln in path.read_text().splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) <= start_step]
    path.write_text("".join(ln + "\n" for ln in kept))


def _record(run: _Run, step: int, loss: float, seconds: float, val_loss: float | None) -> None:
    if run.rank != 0:
        return
    tokens = run.task.tokens_per_step
    row = {"step": step + 1, "loss": loss, "tokens_per_s": tokens / seconds, "step_seconds": seconds,
           "lr": lr_at(step, steps=run.cfg.steps, lr=run.cfg.lr, warmup=run.cfg.warmup)}
    if val_loss is not None:
        row["val_loss"] = val_loss
    with open(_metrics_path(run.cfg), "a") as f:
        f.write(json.dumps(row) + "\n")


def _run_steps(run: _Run, steps: range, *, progress: Progress) -> None:
    cfg = run.cfg
    for step in steps:
        t0 = time.perf_counter()
        loss = _train_step(run, step)
        seconds = time.perf_counter() - t0
        val = evaluate(run) if run.task.eval_batch and cfg.eval_every and (step + 1) % cfg.eval_every == 0 \
            else None
        run.losses.append(loss)
        run.step_seconds.append(seconds)
        _record(run, step, loss, seconds, val)
        saved = cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0
        if saved:
            _save(run, step + 1)
        progress.update(step + 1, loss=loss, tokens_per_s=run.task.tokens_per_step / seconds,
                        step_seconds=seconds, val_loss=val)
        signum = interrupt.agreed_signal(run.mesh)  # every worker stops after the same step
        if signum:
            if cfg.checkpoint_every and not saved:
                _save(run, step + 1)  # the final checkpoint: the last one is older than this step
            raise interrupt.Interrupted(signum, step + 1)


def _save(run: _Run, step: int) -> None:
    ckpt.save_checkpoint(run.cfg.run_dir, step=step, model=run.model, optimizer=run.opt,
                         mesh=run.mesh, rank=run.rank,
                         meta={"data_position": step, "samples_seen": step * run.cfg.batch,
                               "world": run.mesh.size(),
                               "config": dataclasses.asdict(run.cfg)})


def _measure_cpu_peak(run: _Run) -> int | None:
    """This worker's peak bytes over MEASURED_STEPS steps, by FSDPMemTracker.

    The tracker runs on a throwaway copy (same init, same plan, same batches):
    its hook restoration is wrong for units of several layers (it leaves
    grouped FSDP states patched), so the model that trains never sees it.

    [Note: collect before measuring]
    Garbage left in reference cycles by earlier work in the process (a test's earlier runs)
    is freed whenever Python's cyclic collector happens to run, which depends on how many
    objects unrelated code allocated; a tiny GPT's tracked peak moved by 14 KB (2%) between
    two builds whose runtime code was identical. One collection first makes it depend on the
    step alone.
    """
    from shardsched.runtime.memtrack import tracked_peak_bytes
    from shardsched.runtime.parallelize import parallelize
    cfg, world = run.cfg, run.mesh.size()
    gc.collect()  # [Note: collect before measuring]
    model = parallelize(build(cfg, world=world).model, run.plan, mesh=run.mesh)
    opt = build_optimizer(model, cfg)
    batches = [split_micro_batches(run.task.train_batch(s, run.rank, world), run.accum.steps)
               for s in range(MEASURED_STEPS)]

    k = run.accum.steps

    def step(i: int) -> None:  # the training step's arithmetic, one micro-batch a call (`micro_step`)
        micro_step(model, batches[i // k][i % k], i % k, k, grad_sync=run.accum.grad_sync)
        if i % k == k - 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return tracked_peak_bytes(model, opt, step, steps=MEASURED_STEPS * k, inputs=batches[0][0])["Total"]


def _measure_cpu_peak_or_warn(run: _Run) -> int | None:
    """The measurement is a by-product: if the tracker cannot follow this plan,
    say so and train anyway (the summary then reports no measured peak)."""
    try:
        return _measure_cpu_peak(run)
    except Exception as e:  # noqa: BLE001 - any tracker failure, reported below
        if run.rank == 0:
            print(f"warning: peak memory not measured (FSDPMemTracker: {type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)
        return None


def _peak_bytes(run: _Run, cpu_peak: int | None) -> list[int | None]:
    """Every worker's measured peak, in rank order (CUDA: the allocator's peak over the run)."""
    peak = torch.cuda.max_memory_allocated(run.device) if run.device.type == "cuda" else cpu_peak
    peaks: list = [None] * run.mesh.size()
    dist.all_gather_object(peaks, peak, group=run.mesh.get_group())
    return peaks


def _resume(run: _Run) -> int:
    """Load the checkpoint cfg.resume names; returns the step it was taken at."""
    cfg = run.cfg
    path = share_from_rank0(lambda: str(ckpt.find_checkpoint(cfg.resume)), mesh=run.mesh, rank=run.rank)
    meta = ckpt.load_checkpoint(Path(path), model=run.model, optimizer=run.opt, mesh=run.mesh)
    if meta["step"] > cfg.steps:
        raise UsageError(f"checkpoint {path} is at step {meta['step']}, beyond --steps {cfg.steps}")
    if run.rank == 0 and not cfg.quiet:
        print(f"resuming from {path} (step {meta['step']})", flush=True)
        note = schedule_change(meta, cfg)
        if note:
            print(note, flush=True)
    return int(meta["step"])


def schedule_change(meta: dict, cfg: TrainConfig) -> str | None:
    """The line saying the learning rate jumps on resume: the schedule's horizon is
    --steps, so a resume with more (or fewer) steps than the saved run stretches the
    cosine and the rate at the checkpoint's step changes; None when it does not."""
    saved = (meta.get("config") or {})
    step, old_steps = int(meta["step"]), saved.get("steps")
    old_lr, old_warmup = saved.get("lr", cfg.lr), saved.get("warmup", cfg.warmup)
    if not old_steps or old_steps == cfg.steps:
        return None
    before = lr_at(step - 1, steps=old_steps, lr=old_lr, warmup=old_warmup)
    after = lr_at(step, steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup)
    return (f"note: the learning-rate schedule now spans {cfg.steps} steps, not {old_steps}: at step {step} "
            f"the rate goes from {before:.1e} to {after:.1e} (pass --steps {old_steps} to keep the schedule)")


def _write_run_files(cfg: TrainConfig, plan: Plan, task: Task) -> None:
    """plan.json and config.json (with the data actually used); on resume a file whose
    content would change is kept aside first (train/resume.py), never overwritten."""
    from shardsched.train.resume import archive_if_changed
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {**dataclasses.asdict(cfg), "data_used": task.data_used}
    tag = f"before-{Path(cfg.resume).name}" if cfg.resume else "before"
    for name, text, ignore in (("plan.json", plan.to_json(), ()),
                               ("config.json", json.dumps(config, indent=1), ("resume", "quiet"))):
        note = archive_if_changed(run_dir / name, text, tag=tag, ignore=ignore)
        if note and not cfg.quiet:
            print(note, flush=True)


def _setup(cfg: TrainConfig, *, mesh: DeviceMesh, rank: int, device: torch.device, plan: Plan | None) -> _Run:
    """Data, model, plan, parallelize, optimizer: the same on every worker."""
    from shardsched.runtime.parallelize import parallelize
    built = build(cfg, world=mesh.size())
    task = make_task(cfg, built, world=mesh.size())
    model = built.model
    plan = plan or obtain_plan(cfg, built, mesh=mesh, rank=rank)
    model.to(device)
    parallelize(model, plan, mesh=mesh)
    # The optimizer sees the sharded parameters (DTensors), so its state is sharded too.
    opt = build_optimizer(model, cfg)
    accum = run_accumulation(cfg, task, plan, world=mesh.size())
    return _Run(cfg=cfg, mesh=mesh, rank=rank, device=device, model=model, opt=opt, task=task, plan=plan,
                accum=accum)


def run_accumulation(cfg: TrainConfig, task: Task, plan: Plan, *, world: int) -> Accumulation:
    """Micro-batches per step: the flags or the plan's choice (runtime.accum.resolve) for
    models whose rows are the global batch (text, hf: vision); a user's batch_fn sizes its
    own inputs, so it runs them as one micro-batch."""
    from shardsched.runtime.accum import resolve
    from shardsched.train.config import user_sized
    if user_sized(cfg.model):
        return resolve(batch=world, world=world, micro_batch=None, grad_sync=cfg.grad_sync)
    return resolve(batch=cfg.batch, world=world, micro_batch=cfg.micro_batch, grad_sync=cfg.grad_sync, plan=plan)


def train(cfg: TrainConfig, *, mesh: DeviceMesh, rank: int, device: torch.device | None = None,
          plan: Plan | None = None) -> TrainResult:
    """Train on every worker of `mesh`; rank 0 writes the run directory and prints
    (also into RUN_DIR/train.log, see train/progress.py).

    `plan` overrides cfg.plan / make_plan (tests build plans by hand)."""
    from shardsched.runtime.library_warnings import explained
    said: list[str] = []  # FSDP2's and DDP's warnings about the model, in our words, for summary.json

    def say(words: str) -> None:
        said.append(words)
        print(f"note: {words}", file=sys.stderr, flush=True)
    with logged_output(cfg.run_dir, enabled=rank == 0) as log, explained(say if rank == 0 else None):
        return _train(cfg, mesh=mesh, rank=rank, device=device or torch.device("cpu"), plan=plan, log=log,
                      said=said)


def _train(cfg: TrainConfig, *, mesh: DeviceMesh, rank: int, device: torch.device, plan: Plan | None,
           log, said: list[str]) -> TrainResult:
    run = _setup(cfg, mesh=mesh, rank=rank, device=device, plan=plan)
    start = _resume(run) if cfg.resume else 0
    if rank == 0:  # only now: a failed start or resume changes nothing in the run directory
        _write_run_files(cfg, run.plan, run.task)
        _prepare_metrics(cfg, start)
        log.open()  # train.log too (`progress.RunLog`)
    measure = cfg.measure_memory and run.device.type == "cpu"
    cpu_peak = _measure_cpu_peak_or_warn(run) if measure else None
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    mode = progress_mode(quiet=cfg.quiet, stream=sys.stdout) if rank == 0 else ProgressMode.QUIET
    progress = Progress(mode=mode, start=start, total=cfg.steps, log=log, unit=run.task.unit,
                        every=cfg.log_every or default_every(start=start, total=cfg.steps))
    progress.begin(f"{cfg.model}, {mesh.size()} workers, {_shape_words(run)}, {_plan_words(run.plan)}")
    if cpu_peak is not None:
        progress.extra = f"  peak {fmt_bytes(cpu_peak)}/worker"
    try:
        _run_steps(run, range(start, cfg.steps), progress=progress)
    finally:
        progress.close()
    peaks = _peak_bytes(run, cpu_peak) if cfg.measure_memory else [None] * mesh.size()
    summary = _summary(run, start, peaks)
    summary["notes"] += said
    if rank == 0:
        (Path(cfg.run_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        if not cfg.quiet:
            print_summary(summary)
        warning = budget_warning(summary)
        if warning:  # said even under --quiet: the plan's one promise did not hold
            print(warning, file=sys.stderr, flush=True)
    return TrainResult(losses=tuple(run.losses), start_step=start, summary=summary,
                       model=run.model, optimizer=run.opt)


def _shape_words(run: _Run) -> str:
    """The micro-batch (and sequence) each worker trains on; the plan's assumption too
    when it differs (a --plan made for another shape predicts another memory)."""
    from shardsched.plan.report import shape_words
    t, plan, acc = run.task, run.plan, run.accum
    rows = acc.micro_batch if acc.steps > 1 else t.micro_batch
    words = t.inputs_words or f"micro-batch {rows}" + (f" x seq {t.seq}" if t.seq else "")
    assumed = shape_words(plan)
    words = words if assumed == words else f"{words} (the plan assumed {assumed})"
    if acc.steps > 1:
        words += f", {acc.steps} accumulated per step (gradients reduced {_sync_words(acc)})"
    return words


def _sync_words(acc: Accumulation) -> str:
    return "after every micro-batch" if acc.grad_sync is GradSync.EVERY else "after the last micro-batch"


def _plan_words(plan: Plan) -> str:
    from shardsched.plan.report import plural
    from shardsched.runtime.ddp import runs_on_ddp
    kinds = sorted({u.strategy.value for u in plan.units})
    engine = "DDP" if runs_on_ddp(plan) else "FSDP2"
    return f"{plural(len(plan.units), 'unit')} ({', '.join(kinds)}) on {engine}"


def _median_step_seconds(run: _Run) -> float | None:
    return statistics.median(run.step_seconds) if run.step_seconds else None


def _summary(run: _Run, start: int, peaks: list) -> dict:
    cfg, plan = run.cfg, run.plan
    rows = [json.loads(ln) for ln in _metrics_path(cfg).read_text().splitlines() if ln.strip()] \
        if run.rank == 0 else []
    median = _median_step_seconds(run)
    known = [p for p in peaks if p is not None]
    return {
        "first_loss": rows[0]["loss"] if rows else (run.losses[0] if run.losses else None),
        "last_loss": run.losses[-1] if run.losses else (rows[-1]["loss"] if rows else None),
        "last_val_loss": next((r["val_loss"] for r in reversed(rows) if "val_loss" in r), None),
        "steps": cfg.steps, "start_step": start, "world": run.mesh.size(), "model": cfg.model,
        **_shape_fields(run),
        "accumulation": run.accum.steps, "grad_sync": run.accum.grad_sync.value,
        "measured_peak_bytes": max(known) if known else None,
        "measured_peak_bytes_per_worker": peaks,
        "predicted_peak_bytes": plan.predicted.peak_bytes,
        "verified_peak_bytes": plan.verified.peak_bytes if plan.verified else None,
        "memory_budget_bytes": plan.memory_budget_bytes,
        "measured_step_seconds": median,
        "predicted_step_seconds": plan.predicted.step_seconds,
        "tokens_per_s": run.task.tokens_per_step / median if median else None,
        "throughput_unit": run.task.unit,
        "units": [{"name": u.name, "layers": list(u.layers), "strategy": u.strategy.value,
                   "checkpoint": u.checkpoint.suffix} for u in plan.units],
        "notes": list(dict.fromkeys([*plan.notes, *run.task.notes])),  # a model note is in both
        "fingerprint": plan.fingerprint,
        **budget_check(plan, max(known) if known else None),
    }


def _shape_fields(run: _Run) -> dict:
    """summary.json's shapes: --batch/--seq only where the run's data is cut by them (text:
    both, hf: vision: the batch), else null (a python: model's builder sizes its own inputs);
    the micro-batch (null for inputs with no batch dimension) and the example inputs' shapes."""
    t, cfg = run.task, run.cfg
    micro = run.accum.micro_batch if run.accum.steps > 1 else t.micro_batch
    return {"batch": cfg.batch if t.unit in ("tok", "img") else None, "seq": cfg.seq if t.unit == "tok" else None,
            "micro_batch": micro or None, "inputs": t.inputs_words or None,
            "input_shapes": [{"shape": shape, "dtype": dtype} for shape, dtype in t.input_shapes]}


def budget_check(plan: Plan, measured_peak: int | None) -> dict:
    """summary.json's word on the plan's promise: the budget it was made for, the usable part
    of it (less `--headroom`), and whether the measured peak kept under that (None when no
    budget was given or no peak measured)."""
    budget = plan.memory_budget_bytes
    usable = plan.usable_budget_bytes or budget if budget is not None else None
    exceeded = None if usable is None or measured_peak is None else measured_peak > usable
    return {"memory_budget_bytes": budget, "usable_budget_bytes": plan.usable_budget_bytes,
            "headroom_bytes": plan.headroom_bytes, "budget_exceeded": exceeded}


def budget_warning(summary: dict) -> str | None:
    """One line when the measured peak exceeded the plan's budget: the promise broke."""
    if not summary.get("budget_exceeded"):
        return None
    peak, given = summary["measured_peak_bytes"], summary["memory_budget_bytes"]
    budget = summary.get("usable_budget_bytes") or given
    usable = f" (usable, of {fmt_bytes(given)} less headroom)" if budget != given else ""
    return (f"train: warning: measured peak {fmt_bytes(peak)} per worker exceeds the plan's memory budget "
            f"{fmt_bytes(budget)}{usable} ({peak / budget - 1:+.1%}; "
            f"predicted {fmt_bytes(summary['predicted_peak_bytes'])})")
