"""What a real gloo worker on CPU may measure above an exact peak.

[Note: the lagging-buffer allowance]
A gloo worker thread drops its reference to a finished collective's tensors only after `wait()`
has returned ([Note: gloo's lagging buffers] in runtime/gloo.py). The runtime closes that
window for FSDP2's AllGathers (an LSTM worker +5.0% once in CI, 1.06 MB: one unit's flat
parameters) and ReduceScatters (a two-tower worker +6.9% once in CI: gloo's clone of a
reduce-scatter input, [Note: gloo's reduce-scatter copies]); DDP's buckets live the whole run. Tests that compare a real CPU run with the verified or predicted peak allow
one such buffer (the largest unit's flat fp32 gradients or parameters) above it, and nothing
else: a worker may be exact, or over by at most that.
"""
from __future__ import annotations

from shardsched.core.types import Plan

GRAD_BYTES = 4  # reduce-scatter input on CPU is fp32 (the largest of the two buffers)


def lag_bytes(plan: Plan) -> int:
    """The largest buffer one collective of `plan` holds: its largest unit's flat gradients."""
    return GRAD_BYTES * max(u.params for u in plan.units)


def within(measured: int, exact: int, plan: Plan, *, rel: float) -> bool:
    """`measured` is `exact` to `rel`, or above it by no more than one lagging buffer."""
    return abs(measured / exact - 1) <= rel or 0 < measured - exact <= lag_bytes(plan)
