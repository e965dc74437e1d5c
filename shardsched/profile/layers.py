"""Which modules are layers, and which unit owns each parameter (traced and measured profiles).

[Note: layers at any depth]
The outermost parameter-holding modules that are children of a container
(ModuleList / Sequential / ModuleDict) or of a module we look through. We look
through the root, containers, and any module below which a container with >= 2
parameter-holding entries sits (a wrapper such as `self.m = GPT2LMHeadModel(cfg)`,
HF's `transformer` or BERT's `bert.encoder`): that is where transformer blocks live,
the way FSDP wrapping policies pick `ModuleList` children. So a model held one or
more wrappers deep still splits into its embeddings, blocks and heads.

[Note: an inline chain is a layer's body]
An `nn.Sequential` whose parameter-holding entries are all leaves (Linear, Conv, norms:
an MLP or a conv-BN-ReLU chain written inline) is the body of the module holding it,
not a stack of layers: a block with `self.mlp = nn.Sequential(Linear, GELU, Linear)`
is one layer, exactly as one with `self.mlp = MLP()` (a small custom module), so the
same maths plans the same (issue 15: the Sequential form had been split into its
Linears, leaving the residual adds between them outside every layer: 69 MiB least
memory against 14.7 MiB). A `ModuleList` of leaves, or a Sequential of composite
blocks (torchvision's ResNet stages), is still a stack. `--layers` (`resolve_spec`)
names layers outright when the structure says something else.

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

import fnmatch
from collections import defaultdict
from typing import Any, Collection, NamedTuple, Sequence

import torch
import torch.nn as nn

from shardsched._flags import LAYERS_ACCEPTED, layers_items
from shardsched.errors import UsageError
from shardsched.models.notes import model_notes

CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
ROOT = ""


def recomputing() -> bool:
    """A module's forward runs inside backward: a checkpoint in the model recomputing it ([Note: a
    checkpoint inside the model] in profile/trace_fake.py), not a call of the step."""
    return torch._C._current_graph_task_id() != -1


def in_forward(hook):
    """`hook` (a module forward (pre-)hook) run only in the step's forward: a recomputation in
    backward neither opens windows nor counts calls, inputs or outputs again."""
    def guarded(*args, **kwargs):
        return None if recomputing() else hook(*args, **kwargs)
    return guarded


def notes_extra(model: nn.Module) -> dict:
    """{"notes": [...]} for `Profile.extra` when the model carries notes, else {}."""
    notes = model_notes(model)
    return {"notes": list(notes)} if notes else {}


def owns_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _is_leaf(module: nn.Module) -> bool:
    """Holds parameters itself and no child does (Linear, Conv2d, LayerNorm, Embedding)."""
    return owns_params(module) and not any(owns_params(c) for c in module.children())


def _is_stack(module: nn.Module) -> bool:
    """A container of >= 2 parameter-holding entries that are layers, not a layer's body
    ([Note: an inline chain is a layer's body])."""
    if not isinstance(module, CONTAINERS):
        return False
    entries = [c for c in module.children() if owns_params(c)]
    inline = isinstance(module, nn.Sequential) and all(_is_leaf(c) for c in entries)
    return len(entries) >= 2 and not inline


def _has_stack_below(module: nn.Module) -> bool:
    return any(_is_stack(m) for m in module.modules())


def discover(root: nn.Module) -> list[str]:
    """Candidate layers in registration order (see [Note: layers at any depth]). A lone
    layer that holds parameter-holding children is a wrapper (`self.net = MyCNN()`): its
    inside is discovered instead, so a model never plans as one unit for want of a stack."""
    out: list[str] = []
    _collect(root, "", out)
    while len(out) == 1 and any(owns_params(c) for c in root.get_submodule(out[0]).children()):
        inner: list[str] = []
        _collect(root.get_submodule(out[0]), out[0] + ".", inner)
        out = inner
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
    """id(parameter) -> every name it is reachable by, in registration order, each under its
    module's first path ([Note: one layer object at two places])."""
    canon: dict[int, str] = {}
    names: dict[int, list[str]] = defaultdict(list)
    for path, m in model.named_modules(remove_duplicate=False):
        prefix = canon.setdefault(id(m), path)
        for pn, p in m.named_parameters(recurse=False, remove_duplicate=False):
            n = f"{prefix}.{pn}" if prefix else pn
            if n not in names[id(p)]:
                names[id(p)].append(n)
    return dict(names)


# [Note: one layer object at two places]
# `nn.ModuleList([l0, l1, l0, l1])` registers one module object at two paths; its parameters
# are reachable as `layers.0.*` and `layers.2.*`. `named_children` (and so discovery) lists
# the object once, at its first path, and FSDP2 shards the object, not a path: the object is
# one layer run twice ([Note: repeated modules] in plan/units.py), its parameters named under
# its first path. Read as tied names instead (a parameter reachable from two places), they
# spanned two layers, the root held them, and a full_shard plan was 15% over its verified peak.


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
    return _split_until(model, layers, lambda ls: {
        lay for names in by_id.values() if len(names) > 1 and _holder(names, ls) is None
        for n in names for lay in ls if _inside(n, lay) and lay != ROOT})


def isolate(model: nn.Module, layers: list[str], params: Collection[str]) -> list[str]:
    """Split layers that hold any of the parameters named `params` (read outside them: [Note: a
    parameter used outside its layer] in profile/escapes.py) until none does; keeps their order.
    A module holding one directly has no part left to keep it: the root owns it."""
    return _split_until(model, layers, lambda ls: {
        lay for lay in ls if lay != ROOT and any(_inside(n, lay) for n in params)})


def _split_until(model: nn.Module, layers: list[str], bad) -> list[str]:
    """Replace every layer in `bad(layers)` by its parts until that is empty."""
    while bad_now := bad(layers):
        layers = [p for lay in layers for p in (_parts(model.get_submodule(lay), lay) if lay in bad_now else [lay])]
    return layers


def _parts(module: nn.Module, path: str) -> list[str]:
    """The parameter-holding children `module` splits into. A ModuleList or ModuleDict is never
    called, so it cannot be a layer: its entries are (a one-block GPT-2 split around its tied
    embedding lost its block to the root, whose unit then held it: -9.5%)."""
    out = []
    for c, m in module.named_children():
        if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            out += _parts(m, f"{path}.{c}")
        elif owns_params(m):
            out.append(f"{path}.{c}")
    return out


class Assignment(NamedTuple):
    """Layers in execution order and the parameters each owns (by identity, once)."""

    layers: list[str]
    """Layer paths, execution order; ROOT first when it owns anything."""
    params: dict[str, list[nn.Parameter]]
    """Layer -> its parameters, each tensor in exactly one layer."""
    tied: tuple[tuple[str, ...], ...]
    """Every tied set (names of one tensor)."""
    root_tied_numel: int = 0
    """Elements of the tied tensors the root owns (a tied embedding and head)."""
    whole: frozenset = frozenset()
    """Layers never split into children: their own code reads a child's parameter ([Note: a
    parameter used outside its layer] in profile/escapes.py)."""


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
    root_tied = sum(p.numel() for p in params[ROOT] if len(by_id[id(p)]) > 1)
    return Assignment(layers=order, params={lay: params[lay] for lay in order}, tied=tied_sets(model),
                      root_tied_numel=root_tied)


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


# ---------------------------------------------------------------- layers a user names
# [Note: naming layers] `--layers` (plan, train, bench, tradeoff) or, in the `python:`
# contract, a `shardsched_layers` attribute on the model (a string or a list of strings;
# the flag wins) names unit boundaries as FSDP wrapping policies do: each item is a class
# name (`Block`, `LlamaDecoderLayer`: every module of that class, as `ModuleWrapPolicy`), a
# module path (`blocks.0`) or a glob over module paths (`blocks.*`). Named modules are
# layers (the outermost where they nest); the rest of the model is discovered around them
# as usual: discovered layers inside a named one are dropped, and one that holds a named
# one is replaced by its parameter-holding children, recursively.

SPEC_ATTR = "shardsched_layers"


def _matches(item: str, path: str, module: nn.Module) -> bool:
    if any(ch in item for ch in "*?["):
        return fnmatch.fnmatchcase(path, item)
    return path == item or type(module).__name__ == item or type(module).__qualname__ == item


def named_layers(model: nn.Module, spec: str | Sequence[str]) -> list[str]:
    """The outermost modules the spec names, in registration order; one line naming the
    item when an item names no module with parameters."""
    modules = [(n, m) for n, m in model.named_modules() if n and owns_params(m)]
    picked: set[str] = set()
    for item in layers_items(spec):
        hits = {n for n, m in modules if _matches(item, n, m)}
        if not hits:
            raise UsageError(f"layers: {item!r} names no module with parameters of this model "
                             f"({type(model).__name__}); accepted: {LAYERS_ACCEPTED}")
        picked |= hits
    return [n for n, _ in modules if n in picked and not any(_inside(n, o) for o in picked if o != n)]


def _around(model: nn.Module, layer: str, named: list[str]) -> list[str]:
    """A discovered layer with the named ones taken out (see [Note: naming layers])."""
    if layer in named or any(_inside(layer, n) for n in named):
        return []
    if not any(_inside(n, layer) for n in named):
        return [layer]
    kids = [f"{layer}.{c}" for c, m in model.get_submodule(layer).named_children() if owns_params(m)]
    return [k for kid in kids for k in _around(model, kid, named)]


def resolve_spec(model: nn.Module, spec: str | Sequence[str]) -> list[str]:
    """Layer paths for a layers spec: the named modules plus the discovered layers around them."""
    named = named_layers(model, spec)
    return named + [k for d in discover(model) for k in _around(model, d, named)]


def candidates(model: nn.Module, layers: Sequence[str] | None = None) -> list[str]:
    """Layers to profile: given, the model's `shardsched_layers` spec, `model.layer_names()`,
    or discovered; ties isolated."""
    if layers is None and getattr(model, SPEC_ATTR, None) is not None:
        layers = resolve_spec(model, getattr(model, SPEC_ATTR))
    if layers is None and callable(getattr(model, "layer_names", None)):
        layers = list(model.layer_names())
    names = check_given(model, layers) if layers is not None else discover(model)
    return isolate_ties(model, names)


def dims(params: Sequence[nn.Parameter]) -> tuple[tuple[int, int], ...]:
    """(dim-0 size, numel) per parameter: FSDP2 pads dim 0 to a multiple of the shard count."""
    return tuple((int(p.shape[0]) if p.dim() else 1, int(p.numel())) for p in params)


def frozen_numel(params: Sequence[torch.Tensor]) -> int:
    """Elements of the parameters that get no gradient (`requires_grad=False`)."""
    return sum(int(p.numel()) for p in params if not p.requires_grad)


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


def buffer_bytes(model: nn.Module) -> int:
    """`Profile.buffer_bytes`: every buffer once, in its own dtype (mixed precision casts
    parameters, not buffers); the model may live on the meta device."""
    return sum(b.numel() * b.element_size() for b in model.buffers())
