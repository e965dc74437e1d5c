"""Parameters that the code reads outside the module that owns them.

[Note: a parameter used outside its layer]
FSDP2 unshards a unit's parameters in its pre-forward and reshards them after its forward
(full_shard): outside that window the module's attribute is the sharded DTensor. Code that reads
a layer's parameter in another module's forward (`h @ self.emb.weight.t()` in the model's own
forward: an output projection tied by hand, where a static tie registers one tensor twice) then
mixes a DTensor with plain tensors, and the first step fails ("aten.mm.default got mixed
torch.Tensor and DTensor"). Static ties are found before anything runs ([Note: the root unit and
tied parameters] in profile/layers.py); these show only when the code runs. So the profiles
watch every forward op: a parameter read while the module that owns it (the innermost layer or
child holding it) is not running escapes it. Its layer is then split around it as a tie's is
(`layers.isolate`), which leaves the parameter to the root unit, gathered through the whole
forward and backward, and the layers are profiled again (`settled_layers`, a bounded number of
rounds: each splits layers, never joins). A child's parameter read by its own layer's code (a
block reading its attention's weight outside the attention) keeps that layer whole: the layer is
never split into children units (`Escapes.kids`).
"""
from __future__ import annotations

from typing import Callable, Collection, Sequence

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.profile import layers as L

ROUNDS = 8
"""At most this many profilings to settle the layers. A round splits every layer holding a
parameter it saw escape, down to the module holding it; a new escape needs a parameter of a
layer that split out of one that was running (a tower reading its own embedding's weight), so
two rounds settle what was seen; past this bound the verification refuses what still escapes."""


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def owners(model: nn.Module, modules: Sequence[str], state: dict[str, torch.Tensor] | None = None) -> dict[int, tuple[str, str]]:
    """Storage key of every parameter inside one of `modules` -> (its name, the innermost of
    `modules` holding it). `state`: the tensors the run uses by name (a traced profile's fake
    copies); default the model's own."""
    out = {}
    for names in L.param_names(model).values():
        name = names[0]
        holders = [m for m in modules if m != L.ROOT and L._inside(name, m)]
        if not holders:
            continue
        t = state.get(name) if state is not None else model.get_parameter(name)
        if t is not None:
            out[_key(t)] = (name, max(holders, key=len))
    return out


class Escapes(TorchDispatchMode):
    """Watches forward ops for parameters read while their owner is not running.

    `running()`: the layers and children whose forward is running now."""

    def __init__(self, owned: dict[int, tuple[str, str]], running: Callable[[], Collection[str]],
                 parent: dict[str, str]):
        super().__init__()
        self.owned, self.running, self.parent = owned, running, parent
        self.params: set[str] = set()
        """Parameters read outside their layer: their layer must be split."""
        self.kids: set[str] = set()
        """Layers whose code read a child's parameter outside the child: never split into children."""
        self.aliased: set[str] = set()
        """Layers given one floating tensor at two arguments: joined into their parent (`join_aliased`)."""
        self.between: set[str] = set()
        """Layers called again after another layer ran: no layers ([Note: a repeated layer between
        other layers] in profile/trace.py); the run sets it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.owned and not L.recomputing():  # a recomputation reads its layer's parameters in backward
            running = None
            for t in L.tensors_in((args, kwargs)):
                hit = self.owned.get(_key(t))
                if hit is None:
                    continue
                running = set(self.running()) if running is None else running
                name, owner = hit
                if owner not in running:
                    layer = self.parent.get(owner)
                    if layer is not None and layer in running:
                        self.kids.add(layer)
                    else:
                        self.params.add(name)
        return func(*args, **(kwargs or {}))


def settled_layers(model: nn.Module, names: list[str], run: Callable[[list[str]], Escapes]) -> tuple[list[str], Escapes]:
    """Layers from `names` that no forward reads a parameter of from outside: `run(names)`
    profiles (or runs) the model with those layers and returns what it saw; layers holding an
    escaped parameter are split around it and the run repeated ([Note: a parameter used outside
    its layer])."""
    seen = run(names)
    for _ in range(ROUNDS - 1):
        joined = [n for n in join_aliased(model, names, seen.aliased) if n not in seen.between]
        if not seen.params and joined == names:
            break
        names = [n for n in L.isolate(model, joined, seen.params) if n != L.ROOT]
        seen = run(names)
    return names, seen


def given_twice(args, kwargs) -> bool:
    """One floating tensor at two of a call's arguments ([Note: inputs passed twice])."""
    ids = [id(t) for t in L.tensors_in((args, kwargs)) if t.is_floating_point()]
    return len(set(ids)) < len(ids)


def join_aliased(model: nn.Module, names: list[str], aliased: Collection[str]) -> list[str]:
    """`names` with every layer inside the caller of an aliased layer replaced by that caller:
    its nearest ancestor that is no container and not the root. Called by the root's own code
    (none such), it is no layer: its parameters are the root's, which FSDP2 wraps whole, so the
    identity its code tests holds there as in the trace (a Perceiver's `cross(q, kv, kv)`, its
    own unit, took MultiheadAttention's unpacked path under FSDP2: 7.1% under)."""
    out = list(names)
    for a in aliased:
        parent = _caller(model, a)
        if parent is None:
            out = [n for n in out if not (n == a or L._inside(n, a))]
            continue
        if parent not in {p for n in out for p in _ancestors(n)}:
            continue
        inside = [n for n in out if L._inside(n, parent)]
        at = out.index(inside[0])
        out = [n for n in out if n not in inside]
        out.insert(at, parent)
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _caller(model: nn.Module, name: str) -> str | None:
    for path in reversed(_ancestors(name)):
        if not isinstance(model.get_submodule(path), L.CONTAINERS):
            return path
    return None
