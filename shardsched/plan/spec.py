"""The `--strategy` spec: a default strategy plus per-layer overrides.

    full_shard
    auto
    full_shard,blocks.0-3=replicate,head=shard_grad_op
    shard_grad_op,blocks.*=full_shard
    hybrid_shard+ckpt,head=full_shard/node
    full_shard+sac,blocks.0-3=full_shard+ckpt

A key is a layer path, a range `prefix.A-B` (prefix.A .. prefix.B), or an
fnmatch pattern. Later overrides win. A strategy word may end in `+ckpt`
(those layers are activation-checkpointed whole), `+sac` (selective, op-level
checkpointing with torchtitan's op policy: `core.types.Checkpoint`, `runtime.sac`) or
`+sac-all` (selective, every matmul's output kept). Under `auto` the planner chooses
checkpointing itself (a `+ckpt`/`+sac` override pins the strategy only).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from shardsched.errors import UsageError
from shardsched.core.types import Checkpoint, Strategy

ACCEPTED = ("accepted: auto | replicate | shard_grad_op | full_shard | full_shard/node | hybrid_shard | "
            "hybrid_shard_grad_op, each optionally +ckpt, +sac or +sac-all, optionally followed by "
            "',LAYERS=STRATEGY' overrides where LAYERS is a layer path, prefix.A-B or a glob")
CKPT = "+ckpt"
SUFFIXES = {c.suffix: c for c in Checkpoint if c.suffix}
"""`+ckpt`, `+sac` and `+sac-all`: the checkpointing a strategy word may end in."""


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    default: Strategy | None
    """None means "auto": the planner chooses."""
    overrides: tuple[tuple[str, Strategy], ...] = field(default_factory=tuple)
    checkpoint: tuple[tuple[str, Checkpoint], ...] = field(default_factory=tuple)
    """(layer key, checkpointing) in order, "*" first for the default word; later wins."""

    @property
    def auto(self) -> bool:
        return self.default is None

    def for_layers(self, layers: list[str]) -> dict[str, Strategy | None]:
        """Strategy per layer (None where the planner is free to choose)."""
        out: dict[str, Strategy | None] = {name: self.default for name in layers}
        for key, strat in self.overrides:
            hit = _match(key, layers)
            if not hit:
                raise UsageError(f"strategy override {key!r} matches no layer (layers: {_short(layers)})")
            for name in hit:
                out[name] = strat
        return out

    def checkpointed(self, layers: list[str]) -> dict[str, Checkpoint]:
        """Each layer's activation checkpointing (keys already checked by `for_layers`)."""
        out = {name: Checkpoint.NONE for name in layers}
        for key, mode in self.checkpoint:
            for name in _match(key, layers):
                out[name] = mode
        return out


def _split(word: str) -> tuple[str, Checkpoint]:
    """A strategy word and the checkpointing its suffix names (`+ckpt`, `+sac`)."""
    word = word.strip()
    for suffix, mode in SUFFIXES.items():
        if word.endswith(suffix):
            return word.removesuffix(suffix), mode
    return word, Checkpoint.NONE


def _strategy(word: str) -> Strategy:
    try:
        return Strategy.parse(_split(word)[0])
    except ValueError:
        raise UsageError(f"unknown strategy {word.strip()!r}; {ACCEPTED}") from None


def parse_strategy_spec(spec: str) -> StrategySpec:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"empty strategy; {ACCEPTED}")
    head, rest = parts[0], parts[1:]
    if "=" in head:  # only overrides: the planner chooses the rest
        head, rest = "auto", parts
    base, mode = _split(head)
    if base == "auto" and mode:
        raise UsageError(f"auto chooses checkpointing itself: drop {mode.suffix}; {ACCEPTED}")
    default = None if head == "auto" else _strategy(head)
    overrides, ckpt = [], [("*", mode)] if mode else []
    for p in rest:
        key, sep, word = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"malformed strategy override {p!r}; {ACCEPTED}")
        overrides.append((key.strip(), _strategy(word)))
        ckpt.append((key.strip(), _split(word)[1]))
    return StrategySpec(default=default, overrides=tuple(overrides), checkpoint=tuple(ckpt))


_RANGE = re.compile(r"^(.*?)(\d+)-(\d+)$")


def _match(key: str, layers: list[str]) -> list[str]:
    m = _RANGE.match(key)
    if m:
        prefix, a, b = m.group(1), int(m.group(2)), int(m.group(3))
        wanted = {f"{prefix}{i}" for i in range(min(a, b), max(a, b) + 1)}
        return [name for name in layers if name in wanted]
    return [name for name in layers if name == key or fnmatch.fnmatchcase(name, key)]


def _short(layers: list[str]) -> str:
    from shardsched._fmt import short_name  # the root layer "" reads "(root)"
    return ", ".join(map(short_name, layers[:4])) + (", ..." if len(layers) > 4 else "")
