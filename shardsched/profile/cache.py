"""The on-disk cache of traced profiles and verifications: a second `plan` of the same model
skips the fake-tensor trace and the engine's fake run.

[Note: the profile cache]
Measured: a `plan --model python:...` of a small model spent 5 s wall on a busy 2-core
machine, of which torch's import (the user's module imports it) ~2 s and `import torch._dynamo`
~1.9 s, which FakeTensorMode's constructor pulls in (tracing and verification both make one);
the trace itself ~0.15 s, the solver well under that. So both the profile and the verification
(`verify.subject.verifier`) are cached: with both hits no FakeTensorMode is made.

The key holds everything the result is a function of: the model's parameter fingerprint,
its module tree (`repr`: types and their arguments), the source of every module class it
uses (an edited forward is another model), its buffers, an HF `config`, the inputs' structure,
shapes and dtypes (fake tensors see no values but a boolean mask's), the name, device preset and compute dtype
(and for a verification the plan JSON), torch's version, and shardsched's own code (a hash of
every .py file of the package: any change to the profiler or the engine re-traces), and each
module's plain attributes (numbers, strings, booleans: `training`, HF's `gradient_checkpointing`,
which `repr` hides and a forward reads: a GPT-2 traced with gradient checkpointing on was once
handed to the same model with it off). What it cannot see: a forward that reads a global or an
attribute of another kind. Entries are
written atomically (a temporary file, then `os.replace`); one that cannot be read or parsed
is ignored and written again. `SHARDSCHED_CACHE=DIR` moves the cache (default
`$XDG_CACHE_HOME/shardsched`, else `~/.cache/shardsched`); `SHARDSCHED_CACHE=off` turns it off.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable

OFF = "off"


def cache_root() -> Path | None:
    """Where cached entries live; None when `SHARDSCHED_CACHE=off`."""
    env = os.environ.get("SHARDSCHED_CACHE")
    if env == OFF:
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardsched"


@functools.cache
def code_version() -> str:
    """A hash of shardsched's source: a cached result is this code's."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # built in, or defined where no file holds it
        return f"{cls.__module__}.{cls.__qualname__}"


def _inputs(x: Any) -> Any:
    """The inputs as a fake trace sees them: structure, shapes and dtypes, other values' repr."""
    import torch
    if isinstance(x, torch.Tensor):
        out = ["tensor", list(x.shape), str(x.dtype), list(x.stride()), x.requires_grad]
        if x.dtype == torch.bool and x.device.type != "meta":  # [Note: boolean masks on fake tensors]:
            out.append(hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest()[:16])  # the trace reads them
        return out
    if isinstance(x, (tuple, list)):
        return [type(x).__name__, [_inputs(v) for v in x]]
    if isinstance(x, dict):
        return ["dict", [[str(k), _inputs(v)] for k, v in x.items()]]
    return ["value", repr(x)]


def _plain_attributes(model) -> list:
    """Per module, its attributes that are numbers, strings, booleans or None."""
    plain = (bool, int, float, str, type(None))
    return [[name, sorted((k, v) for k, v in vars(m).items() if isinstance(v, plain))]
            for name, m in model.named_modules()]


def model_key(model, inputs: tuple, *extra: Any) -> str:
    """The key of `model` on `inputs` (see [Note: the profile cache]), with `extra` parts."""
    import torch

    from shardsched.profile.fingerprint import fingerprint
    classes = sorted({type(m) for m in model.modules()}, key=lambda c: (c.__module__, c.__qualname__))
    config = getattr(model, "config", None)
    parts = [fingerprint(model), repr(model), [_source(c) for c in classes],
             [[n, list(b.shape), str(b.dtype)] for n, b in model.named_buffers()],
             config.to_json_string() if hasattr(config, "to_json_string") else repr(config),
             _inputs(inputs), torch.__version__, code_version(), _plain_attributes(model), *extra]
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()[:24]


def values_digest(model, inputs: tuple) -> str:
    """A hash of the values of `model`'s parameters and buffers and of the tensor inputs: what
    a trace on real tensors also depends on (a router's choices, a mask's count)."""
    import torch

    from shardsched.profile.layers import tensors_in
    h = hashlib.sha256()
    for t in [*model.parameters(), *model.buffers(), *tensors_in(inputs)]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:24]


def load(kind: str, key: str) -> str | None:
    """The cached text, or None (absent, unreadable, cache off)."""
    root = cache_root()
    try:
        return None if root is None else (root / kind / f"{key}.json").read_text()
    except (OSError, UnicodeDecodeError):
        return None


def store(kind: str, key: str, text: str) -> None:
    """Write an entry atomically; a read-only cache is no error (the next plan traces again)."""
    root = cache_root()
    if root is None:
        return
    path = root / kind / f"{key}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def cached(kind: str, key: str, make: Callable[[], Any], *, to_text: Callable[[Any], str],
           from_text: Callable[[str], Any]) -> Any:
    """`make()`'s result through the cache: a hit is parsed, a corrupt entry ignored."""
    text = load(kind, key)
    if text is not None:
        try:
            return from_text(text)
        except (ValueError, TypeError, KeyError):
            pass  # corrupt or from an incompatible writer: made again below
    value = make()
    store(kind, key, to_text(value))
    return value
