"""How a measured backward peak becomes `LayerProfile.workspace_bytes` ([Note: what the
backward workspace is] in `profile/workspace.py`). Kept apart from the measuring mode so
the analytic profile, and with it `shardsched plan` on a preset, never imports torch."""
from __future__ import annotations


def above_model(measured: int, activation_bytes: int, grad_bytes: int) -> int:
    """`LayerProfile.workspace_bytes` from a measured backward workspace: the simulator's
    backward high-water mark is max(the layer's activations, its unsharded gradients)
    plus the workspace (`sim.memory._backward`, at the start and at the end of the
    backward), while the measured peak rises above its activations by `measured`,
    gradients included. So where the gradients outweigh the activations, the excess
    is already counted and comes off ([Note: what the backward workspace is])."""
    return max(0, measured - max(0, grad_bytes - activation_bytes))


def layer_workspace(measured: int, activation_bytes: int, grad_bytes: int) -> int:
    """A layer's `workspace_bytes`: its measured window above the model. The backward of code
    outside it that was folded into it runs before its window opens (a loss after the last
    layer: before FSDP2 gathers the unit for backward), so that is a moment of its own
    (`outside_workspace`), not part of this ([Note: what the backward workspace is])."""
    return above_model(measured, activation_bytes, grad_bytes)


def outside_workspace(outside_largest: int, measured: int = 0) -> int:
    """`LayerProfile.outside_workspace_bytes`: the backward of the code outside the layer folded
    into it, two of the largest tensor that code saved (cross-entropy's gradients of its
    (T, vocab) inputs), or its backward window as measured where that is more ([Note: the
    loss's backward window] in `profile/workspace.py`). 0 where the layer has no such code."""
    return max(2 * outside_largest, measured) if outside_largest else 0
