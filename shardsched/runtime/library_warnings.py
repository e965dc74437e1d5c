"""PyTorch's warnings that a run cannot act on, said once in our words.

FSDP2 and DDP warn from inside every worker, on every step's first occurrence per process:
4-8 identical lines a run, none saying whether they matter. The two below are about the
user's model, not about how shardsched drives the engines (a fix on our side would change
the model's code or its parameters' memory layout), so `explained` hides them while a run
trains and calls `say` once per kind with what it means for this run. Any other warning is
shown as Python would show it.
"""
from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

KNOWN = {
    # torch/distributed/fsdp/_fully_shard/_fsdp_state.py, _register_pre_backward_hook
    "fsdp2-view": (r"FSDP2-wrapped module \((?P<modules>[^)]*)\) returned a view tensor",
                   "FSDP2 warns that the unit of {modules} returns a view: an in-place op on that output "
                   "later in the forward (`x += y`) would skip the unit's all-gather before its backward and "
                   "corrupt its gradients; out-of-place code (`x = x + y`) is unaffected (said once)"),
    # torch/csrc/distributed/c10d/reducer.cpp, check_grad_layout
    "ddp-strides": (r"Grad strides do not match bucket view strides",
                    "DDP warns that a gradient's memory layout differs from its reduction bucket's (e.g. a "
                    "depthwise convolution's weight on channels-last activations, strides differing on a "
                    "size-1 dimension): DDP copies it into the bucket each step; gradients are exact, the copy "
                    "costs a little time (said once)"),
}


def _modules(text: str) -> str:
    """"FSDPConv2d, FSDPConvNeXtBlock, FSDPConvNeXtBlock" -> "Conv2d, ConvNeXtBlock"."""
    return ", ".join(dict.fromkeys(re.sub(r"^FSDP", "", m.strip()) for m in text.split(",")))


def explanation(message: str) -> tuple[str, str] | None:
    """(kind, our words) for a known library warning, else None."""
    for kind, (pattern, words) in KNOWN.items():
        m = re.match(pattern, message)
        if m:
            return kind, words.format(modules=_modules(m.groupdict().get("modules") or ""))
    return None


@contextmanager
def explained(say: Callable[[str], None] | None) -> Iterator[set[str]]:
    """While open, the KNOWN warnings are not printed; `say` (None: silent, other ranks)
    gets each kind's explanation the first time it happens. Yields the kinds seen."""
    seen: set[str] = set()
    with warnings.catch_warnings():  # restores the filters and showwarning on exit
        shown = warnings.showwarning
        for pattern, _ in KNOWN.values():
            # "always": every occurrence reaches `show`, which decides (not the once-per-line registry)
            warnings.filterwarnings("always", message=pattern, category=UserWarning)

        def show(message, category, filename, lineno, file=None, line=None):
            known = explanation(str(message))
            if known is None:
                return shown(message, category, filename, lineno, file, line)
            if known[0] not in seen:
                seen.add(known[0])
                if say is not None:
                    say(known[1])
        warnings.showwarning = show
        yield seen
