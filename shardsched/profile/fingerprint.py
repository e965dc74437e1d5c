"""A hash of a model's structure, so a plan cannot be applied to another model."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch.nn as nn


def fingerprint_of_shapes(named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    """Hash of (parameter name, shape) pairs in registration order.

    Analytic profiles call this with the shapes a config implies, measured
    profiles and `parallelize` with a real module's; both agree for the same
    architecture, which is what lets a plan made on a laptop run on the cluster.
    """
    h = hashlib.sha256()
    for name, shape in named_shapes:
        h.update(f"{name}:{','.join(str(int(s)) for s in shape)};".encode())
    return h.hexdigest()[:16]


def fingerprint(model: "nn.Module") -> str:
    return fingerprint_of_shapes((n, tuple(p.shape)) for n, p in model.named_parameters())
