"""What a run trains and how each rank gets its batch: the model-and-data contract.

Two kinds of model train (`shardsched train`, `shardsched bench`):

* Text language models (`ModelSpec.text_lm`: presets, `gpt:key=value,...`, `hf:`
  language models): `model(idx, targets)` returns the scalar loss for int64 byte tokens
  of shape (rows, seq). They train on the text corpus (`train.data`, `--data`); the
  corpus is byte-level, so the model's vocabulary must hold at least 256 tokens.
* A user's model, `--model python:module:function`. The function takes no arguments and
  returns `(model, example_inputs)` or `(model, example_inputs, batch_fn)`:

      example_inputs                      -> one worker's inputs (profiled to plan the run)
      model(*inputs)                      -> the scalar loss (mean over this rank's rows)
      batch_fn(step: int, rank: int, world: int) -> tuple: this rank's inputs for `step`

  For a run whose losses do not depend on the number of workers, `batch_fn(step, r, W)`
  should be rows [r*B/W, (r+1)*B/W) of one global batch B that depends on `step` only
  (`text_batch_fn` below builds such a function over the text corpus). Without a
  batch function every step trains on `example_inputs` again (the run says so).

The builder is called after `torch.manual_seed(cfg.seed)` on every worker, so every rank
starts from the same weights (FSDP2 shards what each rank built; it does not broadcast).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
import torch.nn as nn

from shardsched.errors import UsageError
from shardsched.train.config import TrainConfig

BatchFn = Callable[[int, int, int], tuple]
"""batch_fn(step, rank, world) -> this rank's inputs of global batch `step`."""

CONTRACT = ("python:module:function returning (model, example_inputs) or (model, example_inputs, "
            "batch_fn) where model(*inputs) is the scalar loss and batch_fn(step, rank, world) gives a rank's inputs")
REPEATS_NOTE = "has no batch function: every step trains on its example inputs again"


class Built(NamedTuple):
    """A model as built on one worker, with what it trains on."""

    model: nn.Module
    """Freshly built (seeded) model, not yet sharded."""
    example_inputs: tuple
    """One worker's micro-batch: what profiling and validation run."""
    batch_fn: BatchFn | None
    """The user's batch function; None for text models (the corpus feeds them) and for
    user models that gave none (their example inputs repeat)."""
    text_lm: bool
    """True: `model(idx, targets)` trains on byte tokens of the text corpus."""


@dataclass(frozen=True, kw_only=True)
class Task:
    """What every step of a run feeds the model."""

    train_batch: BatchFn
    """(step, rank, world) -> inputs of this rank for training step `step`."""
    eval_batch: BatchFn | None
    """(i, rank, world) -> inputs of validation batch i; None: no validation loss."""
    tokens_per_step: int
    """Tokens (text models), leading-dimension rows (others), or, for inputs with no shared batch
    dimension (a graph), the workers' input sets (one each) of one global step."""
    micro_batch: int = 0
    """Rows of one worker's batch (the shape the console states; 0: not known, or inputs
    with no shared batch dimension, which `inputs_words` then states)."""
    inputs_words: str = ""
    """"inputs as built (...)" where micro_batch is 0 (`profile.measure.inputs_words`)."""
    input_shapes: tuple = ()
    """((shape, dtype), ...) of one worker's example inputs, as summary.json records them."""
    seq: int = 0
    """Tokens per row (0: not token sequences)."""
    unit: str = "tok"
    """What tokens_per_step counts, as the console prints it per second: "tok", "img", "rows" or
    "batches" (`_fmt.UNITS`)."""
    notes: tuple[str, ...] = ()
    """One-line facts about the data a user should know (e.g. repeated inputs)."""
    data_used: dict = field(default_factory=dict)
    """What the run really trained on, for config.json (`source` and sizes)."""


# ---------------------------------------------------------------- building

def build_model(cfg: TrainConfig, *, world: int = 1) -> nn.Module:
    """The same initial weights on every worker (seeded, built before sharding);
    any model `--model` names."""
    return build(cfg, world=world).model


def build(cfg: TrainConfig, *, world: int) -> Built:
    """The model `cfg.model` names, seeded with `cfg.seed`, and one worker's example inputs."""
    from shardsched.models.spec import parse_model_spec
    from shardsched.models.hf import training_defaults
    spec = parse_model_spec(cfg.model)  # UsageError on a bad spec
    if spec.text_lm:
        built = _build_text_lm(cfg, spec, world=world)
    elif spec.sized:  # hf: vision models: built by their spec, fed synthetic labelled images
        built = _build_vision(cfg, spec, world=world)
    else:
        built = _build_user(cfg, spec.name)
    training_defaults(built.model)  # HF models: KV cache off (models/hf.py), as the plan was profiled
    return built


def _build_text_lm(cfg: TrainConfig, spec, *, world: int) -> Built:
    torch.manual_seed(cfg.seed)
    if spec.config is not None:
        from shardsched.models.gpt import GPT
        from shardsched.train.config import model_config
        model = GPT(model_config(cfg.model, seq=cfg.seq))
    else:  # e.g. hf: language models, built by their spec
        model = _call_builder(spec.builder, cfg.model)[0]
        vocab = vocab_size(model)
        if vocab is not None and vocab < 256:
            raise UsageError(f"--model {cfg.model}: vocabulary {vocab} < 256 cannot hold byte-level text")
    from shardsched.train.config import worker_rows
    idx = torch.zeros(worker_rows(cfg, world=world), cfg.seq, dtype=torch.long)  # one micro-batch
    return Built(model=model, example_inputs=(idx, idx.clone()), batch_fn=None, text_lm=True)


def _build_vision(cfg: TrainConfig, spec, *, world: int) -> Built:
    """An image classifier (`model(pixel_values, labels)` is the loss) at this worker's
    micro-batch, trained on `image_batch_fn`'s classes."""
    from shardsched.train.data import check_divisible
    check_divisible(batch=cfg.batch, world=world)
    model, inputs = _call_builder(lambda: spec.builder(micro_batch=cfg.batch // world, seed=cfg.seed), cfg.model)
    pixels = inputs[0]
    classes = int(getattr(model.config, "num_labels", 2))
    fn = image_batch_fn(shape=tuple(pixels.shape[1:]), classes=classes, batch=cfg.batch, seed=cfg.seed)
    return Built(model=model, example_inputs=fn(0, 0, world), batch_fn=fn, text_lm=False)


def image_batch_fn(*, shape: tuple, classes: int, batch: int, seed: int = 0, salt: int = 0) -> BatchFn:
    """batch_fn over synthetic labelled images: class k's images are a fixed coarse
    pattern (8x8 per channel, upsampled to `shape`) plus unit noise, so the classes
    can be learned and the loss falls. Global batch `step` depends on (seed, step, salt)
    only; rank r gets rows [r*B/W, (r+1)*B/W), so losses do not depend on the world size.
    Returns (pixel_values, labels)."""
    import torch.nn.functional as F

    from shardsched.train.data import _generator
    channels, size = shape[0], tuple(shape[1:])
    patterns = torch.randn(classes, channels, 8, 8, generator=torch.Generator().manual_seed(seed + 7))

    def batch_fn(step: int, rank: int, world: int) -> tuple:
        gen = _generator(seed, step, salt)
        labels = torch.randint(0, classes, (batch,), generator=gen)
        noise = torch.randn(batch, *shape, generator=gen)
        rows = slice(rank * (batch // world), (rank + 1) * (batch // world))
        pixels = F.interpolate(patterns[labels[rows]], size=size, mode="nearest") + noise[rows]
        return pixels.contiguous(), labels[rows].contiguous()
    return batch_fn


def _build_user(cfg: TrainConfig, name: str) -> Built:
    fn = _user_function(name)
    torch.manual_seed(cfg.seed)
    out = _call_builder(fn, name)
    if not (isinstance(out, (tuple, list)) and len(out) in (2, 3) and isinstance(out[0], nn.Module)):
        raise UsageError(f"--model {name}: must return (model, example_inputs) or "
                         f"(model, example_inputs, batch_fn), got {_describe(out)}; accepted: {CONTRACT}")
    inputs = out[1] if isinstance(out[1], (tuple, list)) else (out[1],)
    batch_fn = out[2] if len(out) == 3 else None
    if batch_fn is not None and not callable(batch_fn):
        raise UsageError(f"--model {name}: the third value must be batch_fn(step, rank, world), "
                         f"got {type(batch_fn).__name__}; accepted: {CONTRACT}")
    from shardsched.models.spec import returns_loss
    returns_loss(out[0])  # [Note: a forward that returns more than the loss] in models/spec.py
    return Built(model=out[0], example_inputs=tuple(inputs), batch_fn=batch_fn, text_lm=False)


def _user_function(name: str) -> Callable[[], Any]:
    """The raw `python:module:function` (spec parsing already checked that it imports).

    [Note: models.spec wraps the function into a builder that keeps only
    (model, example_inputs), which `plan` needs; training also takes the batch
    function, so the function itself is looked up again here.]"""
    from shardsched.models.spec import _import
    module_name, _, func_name = name[len("python:"):].rpartition(":")
    return getattr(_import(module_name), func_name)


def _call_builder(fn: Callable[[], Any], name: str):
    """fn(), with anything it raises turned into one line naming the model."""
    try:
        return fn()
    except UsageError:
        raise
    except Exception as e:  # the user's code: report it in one line, not a traceback
        raise UsageError(f"--model {name}: the builder raised {type(e).__name__}: {_first_line(e)}") from None


def _describe(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {len(out)}-item {type(out).__name__} of " + ", ".join(type(x).__name__ for x in out)
    return type(out).__name__


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def vocab_size(model: nn.Module) -> int | None:
    """The token vocabulary: `model.vocab_size`, an HF `config.vocab_size`, or the
    input embedding's row count (the first `nn.Embedding`); None if none is found."""
    for obj in (model, getattr(model, "config", None)):
        value = getattr(obj, "vocab_size", None)
        if isinstance(value, int):
            return value
    getter = getattr(model, "get_input_embeddings", None)
    emb = getter() if callable(getter) else next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return emb.num_embeddings if isinstance(emb, nn.Embedding) else None


# ---------------------------------------------------------------- batches

def text_batch_fn(*, batch: int, seq: int, seed: int = 0, data: str | None = None) -> BatchFn:
    """batch_fn over the byte-level text corpus (`--data` or the stdlib sources):
    global batch `step` of `batch` windows of `seq` tokens, rows split over ranks;
    returns (idx, targets). A user builder may return it as its batch function."""
    from shardsched.train.data import load_text
    return _corpus_fn(load_text(data, batch=batch, seq=seq).train, batch=batch, seq=seq, seed=seed, salt=0)


def _corpus_fn(tokens: torch.Tensor, *, batch: int, seq: int, seed: int, salt: int) -> BatchFn:
    from shardsched.train.data import get_batch

    def batch_fn(step: int, rank: int, world: int) -> tuple:
        return get_batch(tokens, seed=seed, step=step, batch=batch, seq=seq, rank=rank, world=world, salt=salt)
    return batch_fn


def make_task(cfg: TrainConfig, built: Built, *, world: int) -> Task:
    """Where each step's inputs come from, and the shape of one worker's batch."""
    import dataclasses

    from shardsched.profile import layers as L
    from shardsched.profile.measure import batch_and_seq, inputs_words, shared_rows
    task = _task(cfg, built, world=world)
    inputs = built.example_inputs
    micro_batch, seq = batch_and_seq(inputs)
    shapes = tuple((list(t.shape), str(t.dtype).removeprefix("torch.")) for t in L.tensors_in(inputs))
    batched = bool(shared_rows(inputs))
    if not batched and task.unit == "rows":  # a graph's nodes are no batch: count each worker's inputs once
        task = dataclasses.replace(task, tokens_per_step=world, unit="batches")
    return dataclasses.replace(task, micro_batch=micro_batch if batched else 0, seq=seq, input_shapes=shapes,
                               inputs_words="" if batched else inputs_words(inputs))


def _task(cfg: TrainConfig, built: Built, *, world: int) -> Task:
    """Where each step's inputs come from: the corpus, synthetic images (hf: vision
    models), the user's batch function, or the example inputs again (on every rank)."""
    from shardsched.models.spec import parse_model_spec
    if built.text_lm:
        from shardsched.train.data import check_divisible, load_text
        check_divisible(batch=cfg.batch, world=world)
        text = load_text(cfg.data, batch=cfg.batch, seq=cfg.seq)
        kw = dict(batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
        # salt 0: training windows, 1: validation windows (`train.data.get_batch`)
        used = {"source": text.source, "train_bytes": int(text.train.numel()), "val_bytes": int(text.val.numel())}
        return Task(train_batch=_corpus_fn(text.train, **kw, salt=0), eval_batch=_corpus_fn(text.val, **kw, salt=1),
                    tokens_per_step=cfg.batch * cfg.seq, data_used=used, notes=(text.note,) if text.note else ())
    if built.batch_fn is not None and parse_model_spec(cfg.model).sized:
        pixels = built.example_inputs[0]
        classes = int(getattr(built.model.config, "num_labels", 2))
        val = image_batch_fn(shape=tuple(pixels.shape[1:]), classes=classes, batch=cfg.batch, seed=cfg.seed, salt=1)
        return Task(train_batch=built.batch_fn, eval_batch=val, tokens_per_step=cfg.batch, unit="img",
                    data_used={"source": f"synthetic images: {classes} classes of {tuple(pixels.shape[1:])}"})
    if built.batch_fn is not None:
        return Task(train_batch=built.batch_fn, eval_batch=None, tokens_per_step=_rows(built.example_inputs) * world,
                    unit="rows", data_used={"source": f"batch_fn of {cfg.model}"})
    inputs = built.example_inputs
    return Task(train_batch=lambda step, rank, world: inputs, eval_batch=None,
                tokens_per_step=_rows(inputs) * world, unit="rows", notes=(f"{cfg.model} {REPEATS_NOTE}",),
                data_used={"source": f"example inputs of {cfg.model}, repeated every step"})


def _rows(inputs: tuple) -> int:
    """Leading dimension of the first input (1 when it has none)."""
    first = inputs[0] if isinstance(inputs, (tuple, list)) and inputs else None
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def to_device(inputs: tuple, device: torch.device) -> tuple:
    """Tensors moved to the worker's device; other values as they are."""
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)


def check_loss(loss: Any, name: str) -> torch.Tensor:
    """The loss a training step backpropagates: a floating tensor with one element."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UsageError(f"--model {name}: model(*inputs) must return the scalar loss, got {got}; "
                         f"accepted: {CONTRACT}")
    return loss.reshape(())


def check_task(cfg: TrainConfig, *, world: int) -> tuple[Built, Task]:
    """Build the model and run its forward on rank 0's first batch, in the parent,
    before any worker starts: a builder that raises or returns the wrong shape, a
    batch function that fails, or a loss that is not a scalar is one line (UsageError)."""
    from shardsched.models.notes import model_notes
    built = build(cfg, world=world)
    task = make_task(cfg, built, world=world)
    task = dataclasses.replace(task, notes=model_notes(built.model) + task.notes)  # said on the console
    inputs = _guarded(lambda: task.train_batch(0, 0, world), f"batch_fn(0, 0, {world})", cfg.model)
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(f"--model {cfg.model}: batch_fn(step, rank, world) must return a tuple of inputs, "
                         f"got {type(inputs).__name__}; accepted: {CONTRACT}")
    with torch.no_grad():
        loss = _guarded(lambda: built.model(*inputs), "model(*inputs)", cfg.model)
    check_loss(loss, cfg.model)
    return built, task


def _guarded(fn: Callable[[], Any], what: str, name: str):
    try:
        return fn()
    except UsageError:
        raise
    except Exception as e:  # the user's code: one line naming what failed
        raise UsageError(f"--model {name}: {what} raised {type(e).__name__}: {_first_line(e)}; "
                         f"accepted: {CONTRACT}") from None
