"""TrainConfig: everything a run is given, and the model it builds."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


from shardsched.errors import UsageError
from shardsched.models.gpt import GPTConfig


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 200
    """Total optimizer steps of the run (a resumed run counts from the checkpoint's step)."""
    seed: int = 0
    """Seeds the model initialisation and every batch."""
    model: str = "tiny"
    """Model spec: a preset name ("tiny", ...) or a spec `shardsched.models.spec` parses."""
    data: str | None = None
    """Text file of training bytes; None: the Python standard library's sources."""
    strategy: str | None = None
    """Strategy spec for make_plan; None: "auto", under --memory-budget or, without
    one, under `solve.auto.default_budget`."""
    plan: str | None = None
    """Path of a plan.json to apply instead of making one."""
    memory_budget_bytes: int | None = None
    """Per-worker memory budget the planner must respect, before `headroom` is taken off."""
    headroom: str | None = None
    """`--headroom` as given ("5%+1GiB"); None: the device preset's default (`cost.headroom`)."""
    verify: bool = True
    """Run the plan once under FSDP2 on fake tensors before training (`shardsched.verify`);
    `--no-verify` skips it and the plan says it is unverified."""
    gpus_per_node: int | None = None
    """Workers per node (None: the whole world is one node); the plan carries it and
    the node-aware strategies shard inside, and replicate across, groups of this size."""
    run_dir: str = "runs/default"
    """Where plan.json, metrics.jsonl, summary.json and checkpoints/ go."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only never)."""
    resume: str | None = None
    """Run directory or checkpoint directory to continue from."""
    batch: int = 8
    """Global batch in sequences (`--batch`, `--global-batch`): rows of one optimizer step
    across all workers; must be divisible by workers x micro-batch."""
    micro_batch: int | None = None
    """Rows per worker per micro-batch (`--micro-batch`); the step accumulates
    batch / (workers x micro_batch) of them (`runtime.accum`). None: the plan's when it
    accumulates, else batch / workers (no accumulation)."""
    choose_batch: bool = False
    """`--global-batch` given: the planner chooses the micro-batch and grad-sync mode that
    `--micro-batch` / `--grad-sync` leave open, fastest per global batch, as `plan
    --global-batch` does (`train.planning.batch_plan`); `--batch` alone never accumulates."""
    grad_sync: str | None = None
    """`--grad-sync`: "every" reduces gradients after every micro-batch, "last" only after
    the last (`core.types.GradSync`); None: the plan's (FSDP2's default, "every", without one)."""
    seq: int = 128
    """Tokens per sequence."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to lr/10)."""
    warmup: int = 10
    """Warmup steps (capped at a tenth of the run)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    eval_every: int = 0
    """Evaluate the validation loss every this many steps (0: never)."""
    eval_batches: int = 4
    """Global batches per validation loss."""
    precision: str = "fp32"
    """"fp32" or "bf16-mixed"."""
    quiet: bool = False
    """No progress bar and no final table."""
    measure_memory: bool = True
    """Measure peak memory (FSDPMemTracker on CPU for the first steps)."""
    cluster: str | None = None
    """Cluster file (`shardsched profile --out`) pricing links and compute for the
    plan; None: the device preset of this machine (`train.planning.run_device`)."""
    log_every: int = 0
    """A plain progress line every this many steps when stdout is no terminal (0: about ten per run)."""
    layers: str | None = None
    """`--layers`: the unit boundaries the user names (profile.layers, [Note: naming layers]);
    None: the model's own `shardsched_layers`, `layer_names()` or discovery."""


def model_config(spec: str, *, seq: int) -> GPTConfig:
    """The GPTConfig a spec names, with room for `seq` positions and a byte vocabulary."""
    from shardsched.models.spec import parse_model_spec
    cfg = parse_model_spec(spec).config  # UsageError on a bad spec
    if cfg is None:
        raise UsageError(f"--model {spec}: not a GPT config (a preset or gpt:key=value,...)")
    if cfg.vocab < 256:
        raise UsageError(f"--model {spec}: vocab {cfg.vocab} < 256 cannot hold byte-level text")
    return dataclasses.replace(cfg, seq=seq) if cfg.learned_pos else cfg


def worker_rows(cfg: TrainConfig, *, world: int) -> int:
    """Rows of the micro-batch one worker runs at a time (what is profiled and traced)."""
    return cfg.micro_batch or max(1, cfg.batch // world)


def user_sized(model: str) -> bool:
    """A `python:` model: its example inputs and batch_fn size every batch (no --batch,
    --seq or --micro-batch applies)."""
    return (model or "").startswith("python:")
