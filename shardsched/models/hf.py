"""`hf:` model specs: Hugging Face `transformers` models from a config, no weights, no network.

Forms (`,key=value` overrides the config's own keys):
  hf:./path/config.json | hf:./dir      a local config (a directory holding config.json)
  hf:meta-llama/Llama-2-7b-hf            a well-known checkpoint: its config values, kept here (HF_PRESETS)
  hf:gpt2 | hf:llama | hf:bert ...       a `transformers` model type with its default config
  hf:gpt2,n_layer=4,n_embd=256           any of the above with overrides

The model gets the project's contract (models/hf_task.py): language models take
`forward(idx, targets)` with byte tokens (batch, seq) and return the scalar loss with
the model's own objective; vision models take `forward(pixel_values, labels)`. The
module is the HF model itself (its forward replaced on the instance), so a plan's
layer names and fingerprint are those of `AutoModelFor...from_config(config)`.
`transformers` is imported only here, only for `hf:`.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Callable

from shardsched.errors import UsageError

if TYPE_CHECKING:
    import torch.nn as nn

# Config values of well-known checkpoints (their config.json on the Hub), so `plan`
# needs no network. Keys are the `transformers` config keys.
HF_PRESETS: dict[str, tuple[str, dict]] = {
    "gpt2": ("gpt2", {}),  # GPT2Config defaults are GPT-2 small (124M, tied head)
    "meta-llama/Llama-2-7b-hf": ("llama", dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "meta-llama/Llama-2-70b-hf": ("llama", dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "mistralai/Mistral-7B-v0.1": ("mistral", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, sliding_window=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
    "Qwen/Qwen2-0.5B": ("qwen2", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
    "bert-base-uncased": ("bert", dict(vocab_size=30522)),  # BertConfig defaults are bert-base
    "t5-small": ("t5", dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128,
                           decoder_start_token_id=0, pad_token_id=0)),
    "google/vit-base-patch16-224": ("vit", dict(image_size=224, patch_size=16, num_labels=1000)),
    "microsoft/resnet-50": ("resnet", dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                                           depths=[3, 4, 6, 3], layer_type="bottleneck", num_labels=1000)),
}
ACCEPTED = ("hf:<config.json path or directory>, hf:<model type, e.g. gpt2, llama, bert, t5, vit>, "
            f"hf:<one of {', '.join(HF_PRESETS)}>, each optionally followed by ,key=value overrides")
# Encoder-only models trained with masked LM (they also appear in the causal-LM mapping).
_MASKED = {"bert", "roberta", "distilbert", "albert", "electra", "camembert", "xlm-roberta", "mpnet",
           "deberta", "deberta-v2", "megatron-bert", "ernie"}


# Keys that size the example inputs rather than the model: a convolutional net (ResNet)
# has no `image_size` in its config but takes any; `,image_size=32` makes tests quick.
_INPUT_KEYS = ("image_size",)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UsageError("hf: models need the optional extra: pip install 'shardsched[hf]'") from None
    transformers.logging.set_verbosity_error()
    return transformers


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"true": True, "false": False}.get(raw.lower(), raw)


def _config_dict(name: str) -> dict:
    """The config values `name` stands for (model_type included)."""
    if name in HF_PRESETS:
        model_type, values = HF_PRESETS[name]
        return {"model_type": model_type, **values}
    if name.endswith(".json") or os.path.exists(name):
        path = os.path.join(name, "config.json") if os.path.isdir(name) else name
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except OSError as e:
            raise UsageError(f"hf: cannot read config {path} ({e.strerror}); accepted: {ACCEPTED}") from None
        except ValueError as e:
            raise UsageError(f"hf: {path} is not JSON ({e}); accepted: {ACCEPTED}") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise UsageError(f"hf: {path} has no 'model_type': not a transformers config.json")
        return data
    if name in _transformers().CONFIG_MAPPING:
        return {"model_type": name}
    raise UsageError(f"hf: unknown model {name!r} (no network: only configs known offline); accepted: {ACCEPTED}")


def split_top_level(body: str) -> list[str]:
    """`body` split at commas outside brackets, so list values such as ResNet's
    `hidden_sizes=[16,32,64,128]` stay one override."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch in "[{(") - (ch in "]})")
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    return parts + [body[start:]]


def _overrides(config, name: str, items: list[str]) -> dict:
    """{key: value} of the `,key=value` items; a key the config does not have is one line."""
    known, out = config.to_dict(), {}
    for item in filter(None, items):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise UsageError(f"hf: bad override {item!r}: expected key=value; accepted: {ACCEPTED}")
        if key not in known and not hasattr(config, key) and key not in _INPUT_KEYS:
            some = ", ".join(sorted(k for k in known if not k.startswith("_"))[:12])
            raise UsageError(f"hf: {name} config has no key {key!r}; accepted keys include: {some}, ...")
        out[key] = _value(raw.strip())
    return out


def _construct(cls, name: str, values: dict):
    """cls(**values); a value the config's own validation refuses is one line."""
    try:
        return cls(**values)
    except Exception as e:  # transformers validates typed fields and consistency here
        msg = str(e).strip().splitlines()[-1].strip() if str(e).strip() else type(e).__name__
        raise UsageError(f"hf: {name} config refuses these values ({msg[:160]}); lists are written [a,b,...]") from None


def hf_config(body: str):
    """The `transformers` config for the text after `hf:`."""
    name, *items = [s.strip() for s in split_top_level(body)]
    if not name:
        raise UsageError(f"hf: no model named; accepted: {ACCEPTED}")
    data = _config_dict(name)
    tf = _transformers()
    model_type = data.pop("model_type")
    if model_type not in tf.CONFIG_MAPPING:
        raise UsageError(f"hf: model_type {model_type!r} is not known to transformers {tf.__version__}")
    cls = tf.CONFIG_MAPPING[model_type]
    base = {k: v for k, v in data.items() if not k.startswith("_")}
    # Overrides go to the constructor, not setattr afterwards: values derived there
    # (Llama's head_dim = hidden_size // num_attention_heads) must see them.
    config = _construct(cls, name, {**base, **_overrides(_construct(cls, name, base), name, items)})
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # Seq2seq models shift labels right from this id; T5's checkpoints use the pad id, 0.
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    return config


def task_of(config) -> str:
    """"seq2seq", "masked", "causal", "vision" or "speech": which objective the wrapper trains."""
    from transformers.models.auto import modeling_auto as ma
    mt = config.model_type
    if _is_speech(config):
        return "speech"
    if getattr(config, "is_encoder_decoder", False) and mt in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "seq2seq"
    if mt in _MASKED and mt in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked"
    if mt in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal"
    if mt in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return "vision"
    raise UsageError(f"hf: model type {mt!r} has no causal, masked, seq2seq LM, image-classification or "
                     f"speech-to-text head")


def _is_speech(config) -> bool:
    """A speech-to-text encoder-decoder (Whisper): mel features in, token labels out."""
    from transformers.models.auto import modeling_auto as ma
    return (config.model_type in ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES
            and hasattr(config, "num_mel_bins") and hasattr(config, "max_source_positions"))


SEQ_CAP = 4096
"""The longest default sequence an `hf:` plan assumes (Llama-2's 4096 positions fit)."""


def default_seq(config) -> tuple[int, str | None]:
    """(the sequence length a plan of this language model assumes without --seq, why it is
    not the model's full length or None). The model's own positions (`n_positions`,
    `max_position_embeddings`; T5's relative positions have no limit: 512, its training
    length), capped at SEQ_CAP: a traced model runs eager attention, which keeps
    seq x seq scores per head, and at 32K-131K positions those would swamp every plan
    with memory that fused attention never allocates."""
    own = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
    if own <= SEQ_CAP:
        return own, None
    return SEQ_CAP, (f"sequence {SEQ_CAP}, not the model's {own} positions: eager attention's seq x seq scores "
                     f"would dominate the plan at that length (give --seq to plan another)")


def hf_builder(body: str) -> tuple[Callable[..., tuple["nn.Module", tuple]], bool, str | None]:
    """(builder, text_lm, seq_note) for `hf:body`; the config is checked now, at parse time.
    builder(*, micro_batch=2, seq=None, device="cpu", seed=0) -> (model, example inputs);
    seq None: `default_seq`, whose reason for a capped length is `seq_note`."""
    config = hf_config(body)
    task = task_of(config)
    text = task not in ("vision", "speech")
    seq_note = default_seq(config)[1] if text else None

    def build(*, micro_batch: int = 2, seq: int | None = None, device: str = "cpu", seed: int = 0):
        from shardsched.models.hf_task import build_task
        seq = seq or (default_seq(config)[0] if text else None)  # a text model's inputs: `default_seq`
        model, inputs = build_task(config, task, micro_batch=micro_batch, seq=seq, device=device, seed=seed)
        training_defaults(model)
        return model, inputs

    return build, text, seq_note


# ---------------------------------------------------------------- training defaults
# [Note: training defaults that change memory] Hugging Face models default to generation
# settings: `config.use_cache=True` makes every decoder layer return its keys and values
# (a `DynamicCache` the model keeps), so a checkpointed layer's K/V stay alive after its
# forward and its recomputation appends to the cache a second time, which crashes Gemma-2,
# Falcon and Whisper at the first backward. transformers turns it off itself when its own
# gradient checkpointing is on (`use_cache=True` is incompatible with gradient checkpointing);
# so does shardsched, whatever the plan, so profile and run agree, for every `hf:` model and
# every `python:` model holding a `PreTrainedModel`, and says so in one line (recorded on the
# model, `models.notes.NOTES_ATTR`: profiles copy it into `Profile.extra["notes"]`, plans
# into `Plan.notes`).


def _is_pretrained(module) -> bool:
    """A transformers `PreTrainedModel`, without importing transformers."""
    return any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)


def training_defaults(model: "nn.Module") -> tuple[str, ...]:
    """Turn off the KV cache of every HF model inside `model` ([Note: training defaults
    that change memory]); returns (and records on `model`) the notes saying so."""
    caching = [m for m in model.modules()
               if _is_pretrained(m) and getattr(getattr(m, "config", None), "use_cache", False)]
    changed = sorted({type(m).__name__ for m in caching})
    for m in caching:
        m.config.use_cache = False
    from shardsched.models.notes import NOTES_ATTR, model_notes
    notes = model_notes(model)
    if changed:
        notes += (f"use_cache=False set on {', '.join(changed)} for training (Hugging Face's default KV cache "
                  f"keeps keys and values alive and grows again when checkpointed layers recompute)",)
        object.__setattr__(model, NOTES_ATTR, notes)
    return notes
