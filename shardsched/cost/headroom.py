"""Headroom: the part of a memory budget the planner leaves free.

A plan's predicted peak counts the tensors PyTorch allocates. A real device also
loses memory to things no profile sees (docs/design.md, "Headroom"):
- the CUDA context: ~300 MB per process with lazy module loading (CUDA >= 11.7),
  over 1 GB before it (pytorch/pytorch#107667, ptrblck);
- NCCL's buffers: 544-688 MB per communicator on 4x A100 (NVIDIA/nccl#964); FSDP2
  opens one per mesh dimension; nccl-tests itself keeps 1 GiB of every device free
  (NVIDIA/nccl-tests#220, `common.cu`: max bytes = (totalGlobalMem - 1 GiB) / 3);
- the caching allocator's fragmentation: blocks reserved but not allocated, a few
  percent of a long run's peak.
So the budget the planner sees is `budget - fraction * budget - fixed_bytes`
(`--headroom`, default per device preset: `DeviceSpec.headroom_fraction`,
`DeviceSpec.headroom_bytes`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from shardsched.cost.bytes import parse_bytes
from shardsched.errors import UsageError

HEADROOM_FORMS = ("accepted: a percentage of the budget (5%), a size (2GiB, 512MiB, a byte count), "
                  "both joined by + (5%+1GiB), or 0 for none")


@dataclass(frozen=True, kw_only=True)
class Headroom:
    fraction: float = 0.0
    """Share of the budget kept free (allocator fragmentation); 0 <= fraction < 1."""
    fixed_bytes: int = 0
    """Bytes kept free besides the share (CUDA context, NCCL buffers)."""

    def bytes_of(self, budget: int) -> int:
        """Bytes subtracted from `budget`."""
        return int(budget * self.fraction) + self.fixed_bytes

    @property
    def text(self) -> str:
        """The `--headroom` spelling of this headroom ("5%+1GiB", "0")."""
        parts = [f"{self.fraction * 100:g}%"] if self.fraction else []
        if self.fixed_bytes:
            gib = self.fixed_bytes / (1 << 30)
            parts.append(f"{gib:g}GiB" if gib == round(gib, 3) else str(self.fixed_bytes))
        return "+".join(parts) or "0"


NO_HEADROOM = Headroom()


def parse_headroom(text: str) -> Headroom:
    """'5%' / '2GiB' / '5%+1GiB' / '0' -> Headroom; UsageError (one line) otherwise."""
    terms = [t.strip() for t in str(text).split("+")]
    if not terms or any(not t for t in terms) or len(terms) > 2:
        raise UsageError(f"bad --headroom {text!r}; {HEADROOM_FORMS}")
    fraction, fixed = 0.0, 0
    for term in terms:
        if term.endswith("%"):
            m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)%", term)
            if m is None or fraction or float(m.group(1)) >= 100:
                raise UsageError(f"bad --headroom {text!r}: a percentage must be one number below 100%; "
                                 f"{HEADROOM_FORMS}")
            fraction = float(m.group(1)) / 100
        elif re.fullmatch(r"0+(?:\.0*)?", term):
            continue  # "0": none of this term
        else:
            if fixed:
                raise UsageError(f"bad --headroom {text!r}: one size at most; {HEADROOM_FORMS}")
            try:
                fixed = parse_bytes(term)
            except UsageError:
                raise UsageError(f"bad --headroom {text!r}; {HEADROOM_FORMS}") from None
    return Headroom(fraction=fraction, fixed_bytes=fixed)


class Budget(NamedTuple):
    """What a plan is made under: the budget given, the headroom taken off it, and what is left."""

    given: int | None
    """The per-worker budget the user gave (`--memory-budget`); None: none given."""
    headroom_bytes: int
    """Bytes kept free (`Headroom.bytes_of` the given budget, else of the device's memory)."""
    usable: int
    """What the planner may fill: the given budget (else the device's memory) less the headroom."""


def usable_budget(given: int | None, *, device_memory: int, headroom: Headroom) -> Budget:
    """The budget a plan is made under. Without a given budget the device's memory is the
    budget (as `solve.auto` takes it), so the headroom is taken off that."""
    base = given if given is not None else device_memory
    cut = headroom.bytes_of(base)
    if base - cut <= 0:
        from shardsched._fmt import fmt_bytes
        what = f"--memory-budget {fmt_bytes(given)}" if given is not None else f"the device's {fmt_bytes(base)}"
        raise UsageError(f"--headroom {headroom.text} ({fmt_bytes(cut)}) leaves nothing of {what}; "
                         f"accepted: a smaller --headroom (e.g. --headroom 0) or a larger --memory-budget")
    return Budget(given=given, headroom_bytes=cut, usable=base - cut)


def headroom_for(text: str | None, device) -> Headroom:
    """`--headroom` as given, else the device preset's default (`DeviceSpec.headroom_*`)."""
    if text is not None:
        return parse_headroom(text)
    return Headroom(fraction=device.headroom_fraction, fixed_bytes=device.headroom_bytes)


def stated(plan, budget: Budget):
    """`plan` stating the budget it was made under (given, headroom, usable)."""
    import dataclasses
    return dataclasses.replace(plan, memory_budget_bytes=budget.given, usable_budget_bytes=budget.usable,
                               headroom_bytes=budget.headroom_bytes)
