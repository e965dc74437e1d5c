"""Which modules are layers, and which unit owns each parameter (traced and measured profiles).

[Note: layers at any depth]
The outermost parameter-holding modules that are children of a container
(ModuleList / Sequential / ModuleDict) or of a module we look through. We look
through the root, containers, and any module below which a container with >= 2
parameter-holding entries sits (a wrapper such as `self.m = GPT2LMHeadModel(cfg)`,
HF's `transformer` or BERT's `bert.encoder`): that is where transformer blocks live,
the way FSDP wrapping policies pick `ModuleList` children. So a model held one or
more wrappers deep still splits into its embeddings, blocks and heads.

[Note: the root unit and tied parameters]
FSDP2 (`fully_shard(model)` last, runtime/parallelize.py) manages every parameter
that no layer's `fully_shard` claimed. Those form the root layer "" (first in
execution order: the root gathers before any child runs and, never resharding
after forward, keeps its parameters until backward ends). It holds:
- parameters the looked-through modules own directly (a CLS token, BERT's
  `predictions.bias`);
- parameters reachable from more than one layer (tied embeddings: GPT-2's
  `wte`/`lm_head`, T5's `shared`): `fully_shard(layer)` would claim a tensor
  another group uses, which FSDP2 refuses. A layer holding such a tensor is split
  into its parameter-holding children until the tie is isolated; a leaf holding
  one goes to the root whole. Each tensor is counted once, by identity;
- parameters of layers whose forward never runs (T5's `shared`, used only
  through its tied copies): they are used where the root's code uses them.
The root's own computation (a loss, anything run between layers) is attributed
to the layer in whose wake it runs (`Attribution`), so it is counted at the
compute step where it happens; none is dropped.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn as nn

from shardsched.errors import UsageError

CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
ROOT = ""
NOTES_ATTR = "shardsched_notes"
"""Attribute of a built model: one-line notes on what shardsched set on it for training
(`models.hf.training_defaults`); profiles copy them into `Profile.extra["notes"]`."""


def model_notes(model: nn.Module) -> tuple[str, ...]:
    return tuple(getattr(model, NOTES_ATTR, ()))


def notes_extra(model: nn.Module) -> dict:
    """{"notes": [...]} for `Profile.extra` when the model carries notes, else {}."""
    notes = model_notes(model)
    return {"notes": list(notes)} if notes else {}


def profile_notes(profile) -> tuple[str, ...]:
    """The notes a profile carries (plans append them to `Plan.notes`)."""
    return tuple(profile.extra.get("notes", ()))


def owns_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _is_stack(module: nn.Module) -> bool:
    return isinstance(module, CONTAINERS) and sum(owns_params(c) for c in module.children()) >= 2


def _has_stack_below(module: nn.Module) -> bool:
    return any(_is_stack(m) for m in module.modules())


def discover(root: nn.Module) -> list[str]:
    """Candidate layers in registration order (see [Note: layers at any depth])."""
    out: list[str] = []
    _collect(root, "", out)
    return out


def _collect(module: nn.Module, prefix: str, out: list[str]) -> None:
    for child_name, child in module.named_children():
        path = f"{prefix}{child_name}"
        if isinstance(child, CONTAINERS) or _has_stack_below(child):
            _collect(child, path + ".", out)
        elif owns_params(child):
            out.append(path)


def _inside(name: str, path: str) -> bool:
    return path == ROOT or name.startswith(path + ".")


def param_names(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every name it is reachable by, in registration order."""
    names: dict[int, list[str]] = defaultdict(list)
    for n, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(n)
    return dict(names)


def tied_sets(model: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Names of every parameter reachable by more than one name."""
    return tuple(tuple(ns) for ns in param_names(model).values() if len(ns) > 1)


def _holder(names: list[str], layers: Sequence[str]) -> str | None:
    """The one layer every name lies in, or None when they span layers or the root."""
    holders = {next((lay for lay in layers if _inside(n, lay)), None) for n in names}
    return holders.pop() if len(holders) == 1 else None


def isolate_ties(model: nn.Module, layers: list[str]) -> list[str]:
    """Split layers that hold a parameter also reachable from outside them (see
    [Note: the root unit and tied parameters]); keeps their order."""
    by_id = param_names(model)
    while True:
        bad = {lay for names in by_id.values() if len(names) > 1 and _holder(names, layers) is None
               for n in names for lay in layers if _inside(n, lay) and lay != ROOT}
        if not bad:
            return layers
        out = []
        for lay in layers:
            if lay not in bad:
                out.append(lay)
                continue
            module = model.get_submodule(lay)
            out += [f"{lay}.{c}" for c, m in module.named_children() if owns_params(m)]
        layers = out


class Assignment(NamedTuple):
    """Layers in execution order and the parameters each owns (by identity, once)."""

    layers: list[str]
    """Layer paths, execution order; ROOT first when it owns anything."""
    params: dict[str, list[nn.Parameter]]
    """Layer -> its parameters, each tensor in exactly one layer."""
    tied: tuple[tuple[str, ...], ...]
    """Every tied set (names of one tensor)."""


def assign(model: nn.Module, layers: Sequence[str], ran: Sequence[str]) -> Assignment:
    """Owner of every parameter: the layer all its names lie in, else the root.
    `ran`: layers whose forward ran, in the order they first ran; the others
    hand their parameters to the root."""
    ran_set = set(ran)
    kept = [lay for lay in ran if lay in set(layers)]
    kept += [lay for lay in layers if lay not in ran_set and lay == ROOT]
    params: dict[str, list[nn.Parameter]] = {lay: [] for lay in [ROOT, *kept]}
    seen: set[int] = set()
    by_id = param_names(model)
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        holder = _holder(by_id[id(p)], [lay for lay in kept if lay != ROOT])
        params[holder if holder is not None else ROOT].append(p)
    order = ([ROOT] if params[ROOT] else []) + [lay for lay in kept if lay != ROOT and params[lay]]
    return Assignment(layers=order, params={lay: params[lay] for lay in order}, tied=tied_sets(model))


def param_children(model: nn.Module, layer: str) -> list[str]:
    """Parameter-holding children a layer may be partitioned into: none when the
    layer owns parameters directly or a tensor is shared between its children
    (each child becomes a `fully_shard` of its own)."""
    if layer == ROOT:
        return []
    module = model.get_submodule(layer)
    if next(module.parameters(recurse=False), None) is not None:
        return []
    kids = [f"{layer}.{n}" for n, c in module.named_children() if owns_params(c)]
    by_id = param_names(module)
    if any(len(ns) > 1 and _holder([f"{layer}.{n}" for n in ns], kids) is None for ns in by_id.values()):
        return []
    return kids


def check_given(model: nn.Module, layers: Sequence[str]) -> list[str]:
    """Layers the user named: module paths, none inside another."""
    modules = dict(model.named_modules())
    for n in layers:
        if n not in modules:
            raise UsageError(f"unknown layer {n!r}: not a module path of the model")
    for a in layers:
        for b in layers:
            if a != b and a and b.startswith(a + "."):
                raise UsageError(f"layers {a!r} and {b!r} overlap: a layer cannot contain another")
    return list(layers)


def candidates(model: nn.Module, layers: Sequence[str] | None = None) -> list[str]:
    """Layers to profile: given, `model.layer_names()`, or discovered; ties isolated."""
    if layers is None and callable(getattr(model, "layer_names", None)):
        layers = list(model.layer_names())
    names = check_given(model, layers) if layers is not None else discover(model)
    return isolate_ties(model, names)


def dims(params: Sequence[nn.Parameter]) -> tuple[tuple[int, int], ...]:
    """(dim-0 size, numel) per parameter: FSDP2 pads dim 0 to a multiple of the shard count."""
    return tuple((int(p.shape[0]) if p.dim() else 1, int(p.numel())) for p in params)


def tensors_in(x: Any) -> list[torch.Tensor]:
    """Every tensor in nested tuples, lists, dicts and HF ModelOutputs (traced and measured profiles)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in tensors_in(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors_in(v)]
    if hasattr(x, "to_tuple") and callable(x.to_tuple):  # HF ModelOutput
        return tensors_in(x.to_tuple())
    return []
