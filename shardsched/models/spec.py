"""Model specs for `--model`: presets, `gpt:key=value,...`, `python:module:function`, `hf:...`.

A spec resolves to either a `GPTConfig` (so the planner can profile it
analytically, without building it: gpt3-175b does not fit in this machine) or a
builder that returns `(model, example_inputs)` for `measure_profile`.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from shardsched.errors import UsageError
from shardsched.models.gpt_config import GPTConfig

if TYPE_CHECKING:
    from shardsched.models.gpt import GPT

PRESETS: dict[str, GPTConfig] = {
    # The default training model: byte-level, fast on 2 CPU cores.
    "tiny": GPTConfig(vocab=256, layers=4, hidden=128, heads=4, seq=128),
    "small": GPTConfig(vocab=256, layers=6, hidden=256, heads=8, seq=256),
    # GPT-2 small / XL (Radford et al. 2019; HF configs). Our head is untied, so
    # these have vocab*hidden more parameters than the published 124M / 1.56B.
    "gpt2": GPTConfig(vocab=50257, layers=12, hidden=768, heads=12, seq=1024),
    "gpt2-xl": GPTConfig(vocab=50257, layers=48, hidden=1600, heads=25, seq=1024),
    # LLaMA (Touvron et al. 2023): SwiGLU, RMSNorm, no biases, rotary positions
    # (nothing stored), untied head, as in the original, so 6.74B exactly.
    "llama-7b": GPTConfig(vocab=32000, layers=32, hidden=4096, heads=32, ffn=11008, seq=4096,
                          mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False),
    # LLaMA-2 70B uses grouped-query attention (8 KV heads); we do not model
    # GQA: our Attention has full multi-head K and V, so this preset has 78.4B
    # parameters (vs 69.0B) and larger K/V activations than the real model.
    "llama-70b": GPTConfig(vocab=32000, layers=80, hidden=8192, heads=64, ffn=28672, seq=4096,
                           mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False),
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads.
    "gpt3-175b": GPTConfig(vocab=50257, layers=96, hidden=12288, heads=96, seq=2048),
}

_INT_KEYS = ("layers", "hidden", "heads", "ffn", "vocab", "seq")
# Upper bounds far above any published model (GPT-3: 96 layers, hidden 12288;
# LLaMA-3 405B: 126 layers, hidden 16384, ffn 53248, vocab 128256), low enough
# that profiling and planning stay interactive (100,000 layers took 54 s).
_INT_MAX = {"layers": 4096, "hidden": 1 << 18, "heads": 1 << 14, "ffn": 1 << 20, "vocab": 1 << 24,
            "seq": 1 << 22}
_CHOICE_KEYS = {"mlp": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm")}
_BOOL_KEYS = ("bias", "learned_pos")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_GPT_KEYS = ", ".join((*_INT_KEYS, *_CHOICE_KEYS, *_BOOL_KEYS))
ACCEPTED = (f"a preset ({', '.join(PRESETS)}), gpt:key=value,... (keys: {_GPT_KEYS}), python:module:function, "
            f"hf:<config.json | model type | checkpoint name>[,key=value...]")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What `--model` named. Exactly one of `config` and `builder` is set."""

    name: str
    """The spec string as given."""
    config: GPTConfig | None = None
    """A GPT config: profile analytically or build with `build_gpt`."""
    builder: Callable[[], tuple[Any, tuple]] | None = None
    """Zero-argument callable returning (model, example_inputs); model(*inputs) is the loss."""
    text_lm: bool = False
    """`model(idx, targets)` with byte tokens idx, targets of shape (batch, seq) returns the
    loss, so `train` can feed it the text corpus (presets, `gpt:`, and `hf:` language models)."""
    sized: bool = False
    """`builder(*, micro_batch, seq, device, seed)` also takes the example inputs' shape and a
    device ("meta": nothing allocated, for planning); `hf:` models."""
    seq_note: str | None = None
    """Why a plan without --seq assumes a shorter sequence than the model's own (hf: models
    with very many positions); plans carry it as a note."""


def parse_model_spec(spec: str) -> ModelSpec:
    """Resolve a `--model` string; raise UsageError (one line) if it is not one of the accepted forms."""
    spec = spec.strip()
    if spec in PRESETS:
        return ModelSpec(name=spec, config=PRESETS[spec], text_lm=True)
    if spec.startswith("gpt:"):
        return ModelSpec(name=spec, config=_parse_gpt(spec[len("gpt:"):]), text_lm=True)
    if spec.startswith("python:"):
        return ModelSpec(name=spec, builder=_python_builder(spec[len("python:"):]))
    if spec.startswith("hf:"):
        from shardsched.models.hf import hf_builder  # imports transformers: only for hf:
        builder, text_lm, seq_note = hf_builder(spec[len("hf:"):])
        return ModelSpec(name=spec, builder=builder, text_lm=text_lm, sized=True, seq_note=seq_note)
    raise UsageError(f"unknown model {spec!r}: accepted: {ACCEPTED}")


def _parse_gpt(body: str) -> GPTConfig:
    """`key=value,...` over the tiny defaults; every value is checked here, so a
    typo fails at the command line instead of deep inside the planner."""
    values: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep:
            raise UsageError(f"bad gpt option {item!r}: expected key=value; accepted keys: {_GPT_KEYS}")
        values[key] = _gpt_value(key, raw)
    cfg = GPTConfig(**values)
    if cfg.hidden % cfg.heads:
        raise UsageError(f"gpt: heads={cfg.heads} must divide hidden={cfg.hidden}; accepted keys: {_GPT_KEYS}")
    return cfg


def _gpt_value(key: str, raw: str) -> Any:
    if key in _INT_KEYS:
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"gpt: {key}={raw[:20]!r} is not an integer; accepted keys: {_GPT_KEYS}") from None
        if value < (0 if key == "ffn" else 1):
            raise UsageError(f"gpt: {key}={value} must be positive; accepted keys: {_GPT_KEYS}")
        if value > _INT_MAX[key]:
            raise UsageError(f"gpt: {key}={value} is above the limit {_INT_MAX[key]}; accepted keys: {_GPT_KEYS}")
        return value
    if key in _CHOICE_KEYS:
        if raw not in _CHOICE_KEYS[key]:
            raise UsageError(f"gpt: {key}={raw!r}: accepted {', '.join(_CHOICE_KEYS[key])}")
        return raw
    if key in _BOOL_KEYS:
        if raw.lower() not in _BOOLS:
            raise UsageError(f"gpt: {key}={raw!r}: accepted true or false")
        return _BOOLS[raw.lower()]
    raise UsageError(f"gpt: unknown key {key!r}; accepted keys: {_GPT_KEYS}")


def _python_builder(body: str) -> Callable[[], tuple[Any, tuple]]:
    """Import `module:function` now (so errors surface at parse time) and wrap
    the function so that anything it does wrong (raises, calls sys.exit, returns
    the wrong shape, a model whose output is not a scalar loss) is a UsageError
    of one line naming it, not a traceback later.

    [Note: python: runs the user's code] The module is imported and the function
    called in this process, with this user's rights: `python:` is for code you
    trust, exactly like `python -c "import module"`. The README and --help say so."""
    module_name, sep, func_name = body.rpartition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"bad model {'python:' + body!r}: expected python:module:function; accepted: {ACCEPTED}")
    module = _import(module_name)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise UsageError(f"model: {module_name} has no function {func_name!r}; accepted: {ACCEPTED}")
    name = f"python:{module_name}:{func_name}"

    def build(*, micro_batch: int | None = None, seq: int | None = None) -> tuple[Any, tuple]:
        kwargs = shape_kwargs(name, fn, micro_batch=micro_batch, seq=seq)
        out = run_user_code(name, "()", lambda: fn(**kwargs))
        # The 3-tuple's batch function is for `train`; a plan needs only the example inputs.
        if not (isinstance(out, (tuple, list)) and len(out) in (2, 3) and isinstance(out[0], _nn_module())):
            raise UsageError(f"model {name}() must return (model, example_inputs) or (model, example_inputs, "
                             f"batch_fn), got {_describe(out)}; accepted: {ACCEPTED}")
        model, inputs = out[0], out[1]
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        from shardsched.models.hf import training_defaults
        training_defaults(model)  # a user's own HF model: its KV cache off, and said
        check_scalar_loss(name, model, inputs)
        return model, inputs

    return build


def shape_kwargs(name: str, fn: Callable, *, micro_batch: int | None, seq: int | None) -> dict:
    """The --micro-batch / --seq a `python:` function is called with: passed as keyword
    arguments when it declares them (`def build(micro_batch=4, seq=128)`), refused in
    one line when it does not (its example inputs fix the shape: ignoring the flags
    silently would plan a shape the user did not ask for)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    out = {}
    for key, value in (("micro_batch", micro_batch), ("seq", seq)):
        if value is None:
            continue
        if key not in params and not takes_all:
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{flag} {value}: {name} takes no {key} argument, its example inputs fix the shape; "
                             f"accepted: leave out {flag}, or declare it: def {name.rpartition(':')[2]}({key}=...)")
        out[key] = value
    return out


def _describe(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)} ({', '.join(type(v).__name__ for v in out[:3])})"
    return type(out).__name__


def run_user_code(name: str, what: str, fn: Callable, *args) -> Any:
    """fn(*args) for code named by `--model python:...`: any exception or
    sys.exit becomes a UsageError of one line naming `name` and what it did."""
    try:
        return fn(*args)
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        raise UsageError(f"model {name}{what} called sys.exit({e.code!r}); accepted: a function that "
                         f"returns (model, example_inputs)") from None
    except UsageError:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's code: report it, whatever it raised
        msg = str(e).splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"model {name}{what} raised {type(e).__name__}{': ' + msg[:200] if msg else ''}") from None


def check_scalar_loss(name: str, model: Any, inputs: tuple) -> None:
    """One forward without gradients: model(*inputs) must be a non-empty floating
    tensor, the loss or (as `measure_profile` documents) a tensor whose sum is it, or hold
    the loss, as nanoGPT's `(logits, loss)` does (`returns_loss`)."""
    import torch

    returns_loss(model)
    with torch.no_grad():
        out = run_user_code(name, " model(*example_inputs)", model, *inputs)
    if not (isinstance(out, torch.Tensor) and out.numel() >= 1 and out.is_floating_point()):
        got = f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}" if isinstance(out, torch.Tensor) \
            else type(out).__name__
        raise UsageError(f"model {name}: model(*example_inputs) must return the loss as a floating tensor "
                         f"(a scalar, or one whose sum is the loss), got {got}; accepted too: a tuple, list or "
                         f"dict holding exactly one 0-dim floating tensor, or an output with a `.loss`")


# [Note: a forward that returns more than the loss]
# nanoGPT's forward returns `(logits, loss)`, others `{"loss": ..., "logits": ...}` or an HF
# ModelOutput. The profile, the verification and the trainer all read one loss tensor, so a
# `python:` model whose output holds exactly one 0-dim floating tensor (or has a `.loss`) is
# made to return that alone, wherever it is built (`plan`, `train`'s workers): its instance's
# `forward` picks it from the class's forward, call by call (a bound method, so a deep copy of
# the model picks from its own forward). The rest of the output is dropped as the forward
# returns, as a training loop that keeps only the loss does; any other output is passed on, to
# be refused in one line where the loss is read.

def loss_key(out: Any) -> Any:
    """Where the loss is in `out` ([Note: a forward that returns more than the loss]): "loss"
    for an output with a `.loss` tensor, an index or key for the one 0-dim floating tensor of
    a tuple, list or dict, else None."""
    import torch

    if isinstance(getattr(out, "loss", None), torch.Tensor):
        return ".loss"
    items = out.items() if isinstance(out, dict) else enumerate(out) if isinstance(out, (tuple, list)) else ()
    keys = [k for k, v in items if isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()]
    return keys[0] if len(keys) == 1 else None


def returns_loss(model: Any) -> None:
    """Make a user's model return its loss alone ([Note: a forward that returns more than the
    loss]); a model with a `forward` of its own instance is left as it is."""
    if "forward" not in vars(model):
        model.forward = types.MethodType(_loss_only, model)


def picked_loss(out: Any) -> Any:
    """The loss `out` holds (`loss_key`), or `out` itself when it holds none or is a tensor."""
    import torch

    key = None if isinstance(out, torch.Tensor) else loss_key(out)
    return out if key is None else out.loss if key == ".loss" else out[key]


def _loss_only(self, *args, **kwargs):
    return picked_loss(type(self).forward(self, *args, **kwargs))


def _import(module_name: str):
    """Import a dotted module or a `.py` path; the current directory is tried
    too, because the `shardsched` console script does not put it on sys.path.
    An exception or sys.exit on import is a UsageError of one line."""
    def load():
        try:
            return _load(module_name)
        except ImportError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UsageError(f"model: cannot import {module_name!r} ({msg}); accepted: {ACCEPTED}") from None
    return run_user_code(f"python:{module_name}", " (on import)", load)


def _load(module_name: str):
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
        if spec is None or not os.path.exists(module_name):
            raise ImportError(f"no file {module_name}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return importlib.import_module(module_name)


def build_gpt(config: GPTConfig, *, micro_batch: int, seq: int, seed: int = 0) -> tuple["GPT", tuple]:
    """A GPT and random token inputs (idx, targets) of shape (micro_batch, seq).

    Seeds a forked RNG, so the same seed gives the same weights on every worker
    without disturbing the caller's global random state.
    """
    if config.learned_pos and seq > config.seq:
        raise UsageError(f"seq={seq} exceeds the model's position table ({config.seq})")
    import torch  # here, not at the top: analytic planning never needs torch

    from shardsched.models.gpt import GPT

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config)
    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, config.vocab, (micro_batch, seq), generator=gen)
    targets = torch.randint(0, config.vocab, (micro_batch, seq), generator=gen)
    return model, (idx, targets)


def config_dict(config: GPTConfig) -> dict:
    """Plain dict of a config (for Profile.extra)."""
    return dataclasses.asdict(config)


def _nn_module() -> type:
    import torch.nn as nn

    return nn.Module
