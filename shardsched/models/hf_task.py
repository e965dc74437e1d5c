"""How a `transformers` model gets the project's contract: model(*inputs) is the loss.

The trained module is the HF model itself (see [Note: the HF model is the trained
module]). Language models take byte tokens `idx` and `targets` of shape (batch, seq) (what
`train` feeds from its text corpus: targets are the next tokens):
- causal LM: cross-entropy of the logits against `targets`;
- masked LM: a deterministic ~15% of positions, derived from the tokens and their
  positions (so every worker and every rerun masks the same ones), are replaced by
  the last vocabulary id and predicted (BERT's objective, Devlin et al. 2019, without
  the random 80/10/10 replacement, which would make the loss depend on an RNG);
- seq2seq: `idx` is the encoder input and `targets` the labels (the model shifts
  them right into its decoder input, as T5 is trained).
Vision models take `(pixel_values, labels)` and return the classification loss.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.errors import UsageError

_MASK_PERCENT = 15


def mlm_mask(idx: torch.Tensor) -> torch.Tensor:
    """Positions to mask: a hash of (token, position) below 15%, plus the middle position
    (so at least one is masked)."""
    pos = torch.arange(idx.shape[1], device=idx.device).expand_as(idx)
    mask = (idx * 31 + pos * 17 + 7) % 100 < _MASK_PERCENT
    return mask | (pos == idx.shape[1] // 2)


# [Note: the HF model is the trained module] The model `build_task` returns is the
# `transformers` model itself, with its forward replaced on this instance by the
# training loss (`_loss_forward`). No wrapper module: parameter names, layer names
# and the fingerprint are exactly those of `AutoModelFor...from_config(config)`, so a
# plan made by `shardsched plan --model hf:X` applies to a user's own model in their
# own FSDP2 script. The loss calls the class's forward (`type(model).forward`), so
# nothing holds a bound method (deepcopy and FSDP2's class swap both keep working).

def _hf_forward(model: nn.Module, **kwargs):
    return type(model).forward(model, **kwargs)


def causal_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = _hf_forward(model, input_ids=idx).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def masked_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    mask, mask_id = mlm_mask(idx), model.config.vocab_size - 1  # the last id is the mask token
    logits = _hf_forward(model, input_ids=torch.where(mask, mask_id, idx)).logits
    labels = torch.where(mask, idx, -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def seq2seq_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # use_cache=False: a decoder cache makes activation checkpointing's recomputation
    # save a different number of tensors than the forward (torch refuses the step)
    return _hf_forward(model, input_ids=idx, labels=targets, use_cache=False).loss


def vision_loss(model: nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return _hf_forward(model, pixel_values=pixel_values, labels=labels).loss


LOSSES = {"causal": causal_loss, "masked": masked_loss, "seq2seq": seq2seq_loss, "vision": vision_loss}


def _loss_forward(self: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return LOSSES[self.shardsched_task](self, *inputs)


def as_loss_model(model: nn.Module, task: str) -> nn.Module:
    """`model` (the HF model itself) with model(*inputs) the loss of `task`
    (see [Note: the HF model is the trained module])."""
    import types
    model.shardsched_task = task
    model.forward = types.MethodType(_loss_forward, model)
    return model


def speech_loss(model: nn.Module, input_features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Speech-to-text (Whisper): log-mel features (batch, mel bins, frames) and token labels;
    the model shifts the labels right into its decoder input, as it is trained."""
    return _hf_forward(model, input_features=input_features, labels=labels, use_cache=False).loss


LOSSES["speech"] = speech_loss


def speech_inputs(config, *, micro_batch: int, seq: int | None, gen: torch.Generator) -> tuple:
    """Features of the length the encoder expects (2 x max_source_positions frames: two
    stride-2 convolutions in Whisper) and `seq` label tokens (default min(32, positions))."""
    frames = 2 * config.max_source_positions
    limit = config.max_target_positions
    seq = seq or min(32, limit)
    if seq > limit:
        raise UsageError(f"seq={seq} exceeds the model's {limit} decoder positions")
    features = torch.randn(micro_batch, config.num_mel_bins, frames, generator=gen)
    return features, torch.randint(0, min(256, config.vocab_size), (micro_batch, seq), generator=gen)


def _hf_model(config, task: str) -> nn.Module:
    import transformers as tf
    auto = {"causal": tf.AutoModelForCausalLM, "masked": tf.AutoModelForMaskedLM,
            "seq2seq": tf.AutoModelForSeq2SeqLM, "vision": tf.AutoModelForImageClassification,
            "speech": tf.AutoModelForSpeechSeq2Seq}[task]
    try:
        return auto.from_config(config)
    except Exception as e:  # transformers checks the config here (e.g. heads must divide the width)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"hf: transformers cannot build a {config.model_type} model from this config ({msg}); "
                         f"fix the config or its key=value overrides") from None


def example_inputs(config, task: str, *, micro_batch: int, seq: int | None, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed + 1)
    if task == "speech":
        return speech_inputs(config, micro_batch=micro_batch, seq=seq, gen=gen)
    if task == "vision":
        size = getattr(config, "image_size", 224)
        channels = getattr(config, "num_channels", 3)
        pixels = torch.randn(micro_batch, channels, size, size, generator=gen)
        return pixels, torch.randint(0, config.num_labels, (micro_batch,), generator=gen)
    # seq: `models.hf.default_seq` unless the caller gave one
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or seq or 512
    if seq > limit:
        raise UsageError(f"seq={seq} exceeds the model's {limit} positions")
    vocab = min(256, config.vocab_size - (1 if task == "masked" else 0))
    idx = torch.randint(0, vocab, (micro_batch, seq), generator=gen)
    return idx, torch.randint(0, vocab, (micro_batch, seq), generator=gen)


def build_task(config, task: str, *, micro_batch: int, seq: int | None, device: str, seed: int):
    """(wrapped model, example inputs); on "meta" nothing is allocated (planning).
    Seeds a forked RNG, so every worker builds the same weights."""
    inputs = example_inputs(config, task, micro_batch=micro_batch, seq=seq, seed=seed)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = _hf_model(config, task)
        model = as_loss_model(model, task)
    return model.train(), inputs
