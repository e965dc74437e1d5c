"""Checks shared by every command's flags: one line, exit 2, before any work.

argparse checks types; these check what argparse lets through: empty strings
(never "use the default"), NaN and infinities, and numbers outside the range a
run can mean.
"""
from __future__ import annotations

import argparse
import math

from shardsched.errors import UsageError

MAX_SEED = 2**63 - 1
"""torch.manual_seed takes seeds in 0..2**64-1; we keep to int64 so a seed round-trips through JSON
readers of every language."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def reject_empty_strings(args: argparse.Namespace) -> None:
    """`--data ''` is an error, not the default: the user typed something."""
    for name, value in vars(args).items():
        if isinstance(value, str) and not value.strip() and name not in ("command",):
            raise UsageError(f"{flag(name)} is empty; give a value or leave the flag out for the default")


def check_int(name: str, value: int | None, *, lo: int, hi: int | None = None) -> None:
    """lo <= value <= hi (None: not given, nothing to check)."""
    if value is None:
        return
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if value < lo else f"at most {hi}"
        raise UsageError(f"{flag(name)} must be {bound}, got {value}")


def check_positive_float(name: str, value: float | None, *, hi: float | None = None) -> None:
    """A finite number > 0 (and <= hi); NaN and infinities are refused."""
    if value is None:
        return
    if not math.isfinite(value) or value <= 0 or (hi is not None and value > hi):
        limit = f" and at most {hi:g}" if hi is not None else ""
        raise UsageError(f"{flag(name)} must be a finite number above 0{limit}, got {value}")


LAYERS_ACCEPTED = ("a class name (e.g. Block, LlamaDecoderLayer), a module path (e.g. blocks.0) or a glob over "
                   "module paths (e.g. 'blocks.*'), comma-separated")
LAYERS_HELP = ("name the layers (unit boundaries) of a python: or hf: model, as FSDP wrapping policies do: "
               + LAYERS_ACCEPTED + "; the rest of the model is discovered around them")


def add_layers_argument(parser: argparse.ArgumentParser) -> None:
    """`--layers` for every command that takes `--model` (profile.layers, [Note: naming layers])."""
    parser.add_argument("--layers", default=None, help=LAYERS_HELP)


def layers_items(spec) -> list[str]:
    """The items of a layers spec (`--layers` text or a `shardsched_layers` string or list);
    one line for an empty item or a non-string. Whether each names a module is checked
    against the model (`profile.layers.named_layers`)."""
    items = spec.split(",") if isinstance(spec, str) else spec
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise UsageError(f"layers must be a string or a list of strings, got {type(spec).__name__}; "
                         f"accepted: {LAYERS_ACCEPTED}")
    items = [i.strip() for i in items]
    if not items or any(not i for i in items):
        raise UsageError(f"layers {spec!r} has an empty item; accepted: {LAYERS_ACCEPTED}")
    return items


HEADROOM_HELP = ("memory left free of --memory-budget (or of the device's memory) before planning: a percentage, "
                 "a size or both, e.g. 5%%, 2GiB, 5%%+1GiB, 0 (default: the device preset's, 5%%+1GiB on GPUs, "
                 "0 on cpu)")


def add_headroom_argument(parser: argparse.ArgumentParser) -> None:
    """`--headroom` for every command that takes a memory budget (`cost.headroom`)."""
    parser.add_argument("--headroom", default=None, help=HEADROOM_HELP)
