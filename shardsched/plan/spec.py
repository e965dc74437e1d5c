"""The `--strategy` spec: a default strategy plus per-layer overrides.

    full_shard
    auto
    full_shard,blocks.0-3=replicate,head=shard_grad_op
    shard_grad_op,blocks.*=full_shard
    hybrid_shard+ckpt,head=full_shard/node

A key is a layer path, a range `prefix.A-B` (prefix.A .. prefix.B), or an
fnmatch pattern. Later overrides win. A strategy word may end in `+ckpt`:
those layers are activation-checkpointed. Under `auto` the planner chooses
checkpointing itself (a `+ckpt` override pins the strategy only).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from shardsched.errors import UsageError
from shardsched.core.types import Strategy

ACCEPTED = ("accepted: auto | replicate | shard_grad_op | full_shard | full_shard/node | hybrid_shard | "
            "hybrid_shard_grad_op, each optionally +ckpt, optionally followed by "
            "',LAYERS=STRATEGY' overrides where LAYERS is a layer path, prefix.A-B or a glob")
CKPT = "+ckpt"


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    default: Strategy | None
    """None means "auto": the planner chooses."""
    overrides: tuple[tuple[str, Strategy], ...] = field(default_factory=tuple)
    checkpoint: tuple[tuple[str, bool], ...] = field(default_factory=tuple)
    """(layer key, checkpointed) in order, "*" first for the default word; later wins."""

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

    def checkpointed(self, layers: list[str]) -> dict[str, bool]:
        """Whether each layer is activation-checkpointed (keys already checked by `for_layers`)."""
        out = {name: False for name in layers}
        for key, on in self.checkpoint:
            for name in _match(key, layers):
                out[name] = on
        return out


def _strategy(word: str) -> Strategy:
    try:
        return Strategy.parse(word.strip().removesuffix(CKPT))
    except ValueError:
        raise UsageError(f"unknown strategy {word.strip()!r}; {ACCEPTED}") from None


def parse_strategy_spec(spec: str) -> StrategySpec:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"empty strategy; {ACCEPTED}")
    head, rest = parts[0], parts[1:]
    if "=" in head:  # only overrides: the planner chooses the rest
        head, rest = "auto", parts
    if head == "auto" + CKPT:
        raise UsageError(f"auto chooses checkpointing itself: drop {CKPT}; {ACCEPTED}")
    default = None if head == "auto" else _strategy(head)
    overrides, ckpt = [], [("*", True)] if head.endswith(CKPT) else []
    for p in rest:
        key, sep, word = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"malformed strategy override {p!r}; {ACCEPTED}")
        overrides.append((key.strip(), _strategy(word)))
        ckpt.append((key.strip(), word.strip().endswith(CKPT)))
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
