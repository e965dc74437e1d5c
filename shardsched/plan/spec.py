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
checkpointing with torchtitan's op policy: `core.types.Checkpoint`, `core.sac_policy`) or
`+sac-all` (selective, every matmul's output kept). Under `auto` the planner chooses
checkpointing itself (a `+ckpt`/`+sac` override pins the strategy only).

[Note: exact specs] (issue 27) Every plan `auto` makes can be written back:
    shard_grad_op@1,embed.tok=full_shard,blocks.0..blocks.2=full_shard/node+sac@2/3,(root)=replicate
A spec is exact when a word carries launch points (`@`), a key is a fused range `A..B`, or a
key names a child of a layer (`blocks.3.attn`, `head.out`; the profile's children). Then
nothing is fused by block size: every layer is its own unit, split into its children where a
key names one of them (the last child takes what the layer runs outside them, as the planner
partitions: `solve.candidates.atoms`), and each `A..B` key is one unit of the layers or
children from A to B. `(root)` names the root unit. The first word's `@K` is FSDP2's prefetch,
every AllGather K units ahead (`sim.scenario.default_launch`); an override's `@F/B` launches that
unit's forward AllGather F steps before its use and its backward one B steps before (`@F`: the
backward one where the first word puts it; `/-`: none). `solve.auto` writes every plan so
(`Plan.strategy_spec`) and `make_plan` of it gives the same plan (tests/solve/test_round_trip.py).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from shardsched.errors import UsageError
from shardsched.core.types import Checkpoint, Strategy

ACCEPTED = ("accepted: auto | replicate | shard_grad_op | full_shard | full_shard/node | hybrid_shard | "
            "hybrid_shard_grad_op, each optionally +ckpt, +sac or +sac-all and @K (launches), optionally followed by "
            "',LAYERS=STRATEGY' overrides where LAYERS is a layer or child path, prefix.A-B, A..B (one unit), "
            "(root) or a glob, and STRATEGY may end in @F/B (steps ahead)")
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
    ahead: int | None = None
    """The first word's `@K`: FSDP2's prefetch K ahead, and the spec is exact ([Note: exact specs])."""
    launch: tuple[tuple[str, tuple[int, int | None | str]], ...] = field(default_factory=tuple)
    """(key, (forward steps ahead, backward steps ahead: None = none, "" = where `ahead` puts it))."""

    @property
    def exact(self) -> bool:
        """Exact by its words ([Note: exact specs]); a key naming a child makes it exact too."""
        return self.ahead is not None or bool(self.launch) or any(".." in k for k, _ in self.overrides)

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


def _launch(word: str) -> tuple[str, str]:
    """A word and its launch part after `@` ("" when none)."""
    word, _, at = word.strip().partition("@")
    return word.strip(), at.strip()


def _split(word: str) -> tuple[str, Checkpoint]:
    """A strategy word and the checkpointing its suffix names (`+ckpt`, `+sac`)."""
    word = _launch(word)[0]
    for suffix, mode in SUFFIXES.items():
        if word.endswith(suffix):
            return word.removesuffix(suffix), mode
    return word, Checkpoint.NONE


def _strategy(word: str) -> Strategy:
    try:
        return Strategy.parse(_split(word)[0])
    except ValueError:
        raise UsageError(f"unknown strategy {word.strip()!r}; {ACCEPTED}") from None


def _steps(text: str, spec: str) -> int:
    if not text.isdigit():
        raise UsageError(f"bad launch {spec!r}: steps ahead are whole numbers (e.g. @1, @2/3, @0/-); {ACCEPTED}")
    return int(text)


def _launch_of(at: str, *, head: bool) -> int | tuple[int, int | None | str]:
    if head:
        return _steps(at, "@" + at)
    f, sep, b = at.partition("/")
    return _steps(f, "@" + at), (None if b == "-" else _steps(b, "@" + at)) if sep else ""


def parse_strategy_spec(spec: str) -> StrategySpec:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"empty strategy; {ACCEPTED}")
    head, rest = parts[0], parts[1:]
    if "=" in head:  # only overrides: the planner chooses the rest
        head, rest = "auto", parts
    base, mode = _split(head)
    if base == "auto" and (mode or _launch(head)[1]):
        raise UsageError(f"auto chooses checkpointing and launches itself: drop {mode.suffix or '@'}; {ACCEPTED}")
    default = None if base == "auto" else _strategy(head)
    ahead = _launch_of(_launch(head)[1], head=True) if _launch(head)[1] else None
    overrides, ckpt, launch = [], [("*", mode)] if mode else [], []
    for p in rest:
        key, sep, word = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"malformed strategy override {p!r}; {ACCEPTED}")
        overrides.append((key.strip(), _strategy(word)))
        ckpt.append((key.strip(), _split(word)[1]))
        if _launch(word)[1]:
            if default is None:
                raise UsageError(f"auto chooses launch points itself: drop @ from {p!r}; {ACCEPTED}")
            launch.append((key.strip(), _launch_of(_launch(word)[1], head=False)))
    return StrategySpec(default=default, overrides=tuple(overrides), checkpoint=tuple(ckpt), ahead=ahead,
                        launch=tuple(launch))


ROOT_KEY = "(root)"
"""How a spec names the root unit (the layer "")."""
_RANGE = re.compile(r"^(.*?)(\d+)-(\d+)$")


def _match(key: str, layers: list[str]) -> list[str]:
    if key == ROOT_KEY:
        return [name for name in layers if name == ""]
    if ".." in key:  # A..B: the names from A to B, in order
        a, _, b = key.partition("..")
        if a in layers and b in layers and layers.index(a) <= layers.index(b):
            return layers[layers.index(a):layers.index(b) + 1]
        return []
    m = _RANGE.match(key)
    if m:
        prefix, a, b = m.group(1), int(m.group(2)), int(m.group(3))
        wanted = {f"{prefix}{i}" for i in range(min(a, b), max(a, b) + 1)}
        return [name for name in layers if name in wanted]
    return [name for name in layers if name == key or fnmatch.fnmatchcase(name, key)]


def _short(layers: list[str]) -> str:
    from shardsched._fmt import short_name  # the root layer "" reads "(root)"
    return ", ".join(map(short_name, layers[:4])) + (", ..." if len(layers) > 4 else "")


def exact_spec(units, owner: dict[str, str]) -> str:
    """The exact spec of a plan ([Note: exact specs]): `units` as (layer or child names, strategy,
    checkpointing, forward launch step, backward launch step or None) in order; `owner`: each
    child's layer (a child among the names: its layer is split, so some key must name one)."""
    from shardsched.plan.units import root_strategy
    from shardsched.sim.scenario import default_launch

    n = len(units)
    plain = [(k, Checkpoint(c)) for names, k, c, _, _ in units if names != ("",)]
    words = [(k, c) for k, c in dict.fromkeys(plain)]
    default, dmode = max(words, key=lambda w: (plain.count(w), -words.index(w))) if words else (units[0][1], Checkpoint.NONE)
    fwd_def, bwd_def = default_launch(tuple(u[1] for u in units), ahead=1)
    out, named = [f"{default.label}{dmode.suffix}@1"], set()
    for u, (names, k, c, f, b) in enumerate(units):
        c = Checkpoint(c)
        root = names == ("",)
        key = ROOT_KEY if root else names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        at = "" if (f, b) == (fwd_def[u], bwd_def[u]) else f"@{u - f}" + (
            "" if b == bwd_def[u] else "/-" if b is None else f"/{2 * n - 1 - u - b}")
        same = (k, c) == ((root_strategy(default), Checkpoint.NONE) if root else (default, dmode))
        word = f"{k.label}{c.suffix}{at}"
        if len(names) > 1 or not same or at:
            out.append(f"{key}={word}")
            named.update(owner[x] for x in (names[0], names[-1]) if x in owner)
        for child in names:  # a split layer must have a child named, or the spec would not split it
            if child in owner and owner[child] not in named:
                out.append(f"{child}={word}")
                named.add(owner[child])
    return ",".join(out)
