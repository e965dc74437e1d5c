"""What one unit costs: its bytes and seconds, layer by layer (`UnitCost`), and the moments
inside a fused unit's backward (`Inner`). `plan.units.unit_cost` builds it from the profile;
`sim.scenario.Scenario` replays a schedule of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from shardsched.cost.memory import shard_numel


class Inner(NamedTuple):
    """One moment inside a fused unit's backward (`UnitCost.inner_moments`)."""

    own: int
    """Its own bytes that do not depend on the strategy: gradients, activations, workspace."""
    reducing: int
    """The layer whose ReduceScatter input is live."""
    done: int
    """The layers after this one have reduced: their sharded gradients are live."""
    gathered: bool
    """Its AllGather output is live (a module's copy-out)."""
    resharded: bool = False
    """Its unsharded parameters are freed: FSDP2's `post_backward` reshards the unit's group
    before it reduces (`FSDPParamGroup.post_backward`: `reshard()`, then `foreach_reduce`)."""
    output: bool = False
    """Its module's reduce allocates the ReduceScatter output beside the input while the
    tracker still holds the last parameter's gradient (`UnitCost.reduce_extra_bytes`)."""
    tied: bool = True
    """The root's tied gradient can exist by now: False before the backward of the unit's layer
    that makes it (`UnitCost.tied_at`; [Note: where the root's tied gradient appears])."""

    def beside_root(self, root: int) -> int:
        """`own` where the callers count the root's tied gradient (`root` bytes) at every moment
        of the unit: less it where it does not exist yet."""
        return self.own if self.tied else self.own - root


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    """The profile of one unit (the sum over its layers)."""

    name: str
    layers: tuple[str, ...]
    params: int
    forward_seconds: float
    frozen_params: int = 0
    """Of `params`, those with no gradient (`LayerProfile.frozen_params`)."""
    unused_params: int = 0
    """Of `params`, those needing one that the step never gives one (`LayerProfile.unused_params`)."""
    backward_seconds: float
    activation_bytes: int
    """Retained from the unit's forward until its backward."""
    workspace_bytes: int = 0
    """Transient bytes while the unit computes (largest activation-gradient buffers)."""
    dims: tuple[tuple[int, int], ...] = ()
    """(dim-0 size, numel) per parameter, for FSDP2's dim-0 padding; () = unknown."""
    lead_activation_bytes: int = 0
    """Activations of all its layers but the last, and the last one's input: live when its last module starts."""
    input_bytes: int = 0
    """What it retains instead when checkpointed: its layers' forward inputs, and what
    code outside them saved (`LayerProfile.outside_bytes`: not recomputed)."""
    entry_bytes: int = 0
    """Its first layer's `LayerProfile.entry_bytes` and `held_to_save_bytes`: live at its copy-out."""
    held_to_save_bytes: int = 0
    """Of `entry_bytes`, its first layer's `LayerProfile.held_to_save_bytes`."""
    exit_bytes: int = 0
    """Its last layer's `LayerProfile.exit_bytes`: what the code after its forward holds
    beyond what is saved, while its AllGather output is still held (`sim.memory._forward`)."""
    checkpointed_lead_bytes: int = 0
    """`lead_activation_bytes` when checkpointed: its other layers keep only their inputs."""
    layer_bytes: tuple = ()
    """Per layer, in forward order: (bytes kept when checkpointed, activations, workspace,
    parameters, bytes live while it is recomputed, forward transients: `plan.units.LayerBytes`), for the moments inside its backward ([Note: checkpointed units, layer
    by layer] in `plan.units`)."""

    outside_workspace_bytes: int = 0
    """Transient of the backward of code outside its last layer (a loss after it), which runs
    before FSDP2 gathers the unit for backward (`LayerProfile.outside_workspace_bytes`)."""
    outside_activation_bytes: int = 0
    """What that code saved (`LayerProfile.outside_bytes` of its last layer): its backward
    frees them before the unit's own backward starts."""
    layer_dims: tuple[tuple[tuple[int, int], ...], ...] = ()
    """`dims` per layer of the parameters that get a gradient (for the per-module ReduceScatter
    inputs of a fused unit; a wholly frozen layer has none); () = unknown."""
    outside_input_bytes: int = 0
    """Selective form only: its last layer's saved outputs that the code outside it reads
    (`LayerProfile.selective_outside_input_bytes`): at that code's forward they are the input
    `outside_workspace_bytes // 2` stands for, so they are not counted twice (`after_forward`)."""
    exit_kept_bytes: int = 0
    """Selective form only: of `exit_bytes`, the outputs of its earlier layers the caller holds
    that its policy keeps too (counted in its activations: `after_forward`)."""
    code_held: dict = field(default_factory=dict)
    """Its first layer's `LayerProfile.code_held`: per earlier layer, (bytes when that layer
    recomputes, when selectively) of its outputs the calling code holds beside this unit's
    forward ([Note: outputs the caller's code holds] in profile/held.py)."""
    code_held_bytes: int = 0
    """Its first layer's `LayerProfile.code_held_bytes`: held beside its forward whatever recomputes."""
    recompute_seconds: float | None = None
    """Seconds its backward spends recomputing when checkpointed; None: its whole forward
    (full checkpointing). A selective unit's cost (`plan.units.unit_cost`) sets it to the
    ops the policy recomputes ([Note: selective checkpointing as kept bytes])."""
    forward_ops: int = 0
    """Operators its layers' forwards dispatch (`LayerProfile.forward_ops`; 0 = unknown): what
    the host's time is priced by ([Note: host time per op] in plan/schedule.py)."""
    selective: bool = False
    """The cost of its selective form (`plan.units.unit_cost` under `+sac` / `+sac-all`): its
    forward and recomputation also run selective checkpointing's dispatch modes."""
    root_forward_bytes: int = 0
    """The root unit of a model with no layer: its forward's transient above what it saves
    (`LayerProfile.forward_peak_bytes`; else 0: the root's code before the first layer saves)."""
    tied_at: int | None = None
    """Its layer whose backward (or its outside code's) first makes the gradient of the root's
    tied tensors (`LayerProfile.makes_tied_grad`); None: none of its layers."""
    lead_resaved_bytes: int | None = None  # its first layer's `LayerProfile.input_resaved_bytes`
    lead_saved_before_bytes: int = 0  # its first layer's `input_saved_before_bytes` (`kept_before`)
    lead_shared_bytes: int = 0  # its first layer's `input_shared_bytes` (`kept_before(shared=True)`)

    def kept_before(self, *, shared: bool = False) -> "UnitCost":
        """[Note: an input the unit before keeps] A recomputed unit keeps its first layer's input,
        saved first by a unit before that does not recompute (a ReLU ending it: a CNN alternating
        checkpointed and plain blocks, 19% over) or, `shared`, kept by one that does (a T5 bias
        every block takes, one unit each: +9.3% under +sac): counted there. MILP: the bound."""
        kb, lb = self.lead_shared_bytes if shared else self.lead_saved_before_bytes, self.layer_bytes
        if not kb or not lb:
            return self
        first = lb[0]._replace(kept=lb[0].kept - kb, redo=lb[0].redo - kb, inp=max(0, lb[0].inp - kb))
        return replace(self, input_bytes=self.input_bytes - kb, layer_bytes=(first, *lb[1:]),
                       checkpointed_lead_bytes=self.checkpointed_lead_bytes - (kb if len(lb) > 1 else 0))

    @property
    def tied_late(self) -> bool:
        """A layer before its last makes the root's tied gradient: the moments of its backward
        until then (its start, its last layer's end, its copy-out) hold none ([Note: where the
        root's tied gradient appears] in profile/trace.py)."""
        return self.tied_at is not None and self.tied_at + 1 < len(self.layers)

    def module_reduce_numel(self, n: int, *, last: bool) -> int:
        """Elements of one module's ReduceScatter input over n shards: FSDP2 (torch 2.13)
        reduces a fused unit module by module ([Note: checkpointed units, layer by layer] in
        plan/units.py), so the input retained after the unit's backward is its first layer's
        (the last to run backward; `last=True`), and the largest its own reduce holds is its
        largest layer's. A unit of one layer, or without per-layer dims: the whole unit's."""
        if len(self.layers) < 2 or len(self.layer_dims) != len(self.layers):
            return self.trainable(self.padded_numel(n))
        shards, (nxt, _) = self._layer_shards(n), self._posting()
        sizes = [int(n * sum(shards[k:nxt[k]])) for k in sorted(self._posts())]  # [Note: modules with no post-backward]
        return sizes[0] if last else max(sizes)

    @property
    def repeats(self) -> bool:
        """One layer its model calls more than once ([Note: a repeated layer's later forward
        calls] in plan/units.py): its later calls start as a fused unit's last module does."""
        return len(self.layers) == 1 and len(self.layer_bytes) == 1 and self.layer_bytes[0].calls > 1

    def grad_in_bytes(self) -> int:
        """As its backward starts, beyond what it and the units before it keep: the gradient of
        its output (`LayerProfile.output_bytes` of its last layer; 0 = unknown) and those in flight
        around it (`LayerProfile.flight_bytes`), the loss after it having freed what it saved (a
        logits-sized gradient where a log-softmax was saved)."""
        last = self.layer_bytes[-1] if self.layer_bytes else None
        return (last.out + last.flight if last else 0) - self.outside_activation_bytes

    def recall_bytes(self, grad_bytes: float, *, checkpointed: bool, gathered: bool, inner: bool = True) -> int:
        """Its own bytes in the backward of a repeated layer's earlier call ([Note: a repeated
        module's later calls] in plan/units.py); 0 when no layer of it repeats. Next to the
        activations (kept bytes when checkpointed) of the layers before it and of its calls not
        yet done, the gradient its done calls accumulated and the layers after it's gradients
        (unsharded: an upper bound of their ReduceScatter input and shards): as FSDP2 gathers it
        again (`gathered`), the gradient of the call's output; as the call computes, its
        workspace (checkpointed: the call recomputed, `recall_redo`). `inner`: a layer before
        the unit's last is one of `inner_moments` (its later layers as they are: reduced), so
        only a repeated last layer is counted here (DDP, which has no inner moments: `False`)."""
        reps = [k for k, b in enumerate(self.layer_bytes) if b.calls > 1]
        if not reps or (inner and reps[-1] + 1 < len(self.layer_bytes)):
            return 0
        k, bs = reps[-1], self.layer_bytes
        before = sum(x.kept if checkpointed else x.act for x in bs[:k])
        later = sum(int(x.params * grad_bytes) for x in bs[k + 1:])
        return before + _recall_own(bs[k], checkpointed, gathered) + int(bs[k].params * grad_bytes) + later

    def handed_over_bytes(self) -> int:
        """Of its input, what the plain trace counts as saved by the layer before it (a ReLU's,
        a pooling's output): when that unit recomputes, nothing of it saves its output, so
        this unit's own saved input (or, recomputing too, its kept input) holds it ([Note: the
        output a recomputed unit hands over]): as far as it saves it (a GNN layer: none, +2.3%)."""
        handed = self.entry_after_checkpointed() - self.entry_bytes
        return handed if self.lead_resaved_bytes is None else min(handed, self.lead_resaved_bytes)

    def entry_after_checkpointed(self) -> int:
        """Its input live at its copy-out when the unit before it recomputes (full or selective):
        `entry_bytes` is the plain trace's, where the layer before may have saved its output (a
        ReLU, a pooling); checkpointed, nothing did (a CNN after a selective block: 2% under)."""
        return max(self.entry_bytes, (self.layer_bytes[0].inp if self.layer_bytes else 0) + self.held_to_save_bytes)

    def after_forward(self) -> int:
        """Beyond what is saved, what lives once its forward is over, before the next unit's
        copy-out, next to its held AllGather output: the code after it, measured ([Note: exit
        windows] in profile/workspace.py), or else the loss's logits-sized temporary (half
        `outside_workspace_bytes`, [Note: the loss before the unit's backward]), less what a
        selective last layer already keeps of the loss's input (its logits)."""
        return max(0, max(self.exit_bytes - self.exit_kept_bytes, self.outside_workspace_bytes // 2)
                   - self.outside_input_bytes)

    def recompute(self) -> float:
        """Seconds its backward recomputes when checkpointed (`recompute_seconds`)."""
        return self.forward_seconds if self.recompute_seconds is None else self.recompute_seconds

    def checkpointed_start(self) -> int:
        """Its own bytes as its backward starts when checkpointed: its last layer recomputed
        (its live bytes) and its workspace, next to the kept inputs of the layers before it;
        the loss after it already ran its backward, freeing what it saved."""
        before = sum(b.kept for b in self.layer_bytes[:-1])
        last = self.layer_bytes[-1]
        return before + last.redo - self.outside_activation_bytes + last.ws

    def backward_peak(self) -> int:
        """Its own activations and workspace at the peak of its backward when not
        checkpointed: layers run backward last to first, and layer k's backward frees the
        activations of the layers after it, so the peak is the most over k of the
        activations of layers 0..k and layer k's workspace (not all activations next to
        the largest workspace: that over-counted a fused CNN by 24%). The last layer's
        outside code (the loss) ran its backward first, freeing what it saved."""
        if not self.layer_bytes:
            return self.activation_bytes + self.workspace_bytes
        if len(self.layers) > 1:  # fused: the layers before its last are `inner_moments`
            before = sum(b.act for b in self.layer_bytes[:-1])
            return before + self.layer_bytes[-1].act + self.layer_bytes[-1].ws - self.outside_activation_bytes
        return self._layer_by_layer(lambda k, b: b.backward_own(b.ws))

    def bucketed_peak(self) -> int:
        """`backward_peak` as DDP runs it: each gradient leaves for the bucket as it is
        accumulated, so its windows are the bucketed ones ([Note: bucketed windows] in
        profile/workspace.py) and no layer's gradients are held at its end."""
        if not self.layer_bytes:
            return self.activation_bytes + self.workspace_bytes
        return self._layer_by_layer(lambda k, b: b.backward_own(b.bws, self._flight_after(k)))

    def _flight_after(self, k: int) -> int:
        """`LayerBytes.flight` of its layer after k (0 after its last)."""
        return self.layer_bytes[k + 1].flight if k + 1 < len(self.layer_bytes) else 0

    def bucketed_peaks(self) -> tuple[int, int]:
        """`bucketed_peak` of a `tied_late` unit, (before, after) the root's tied gradient
        appears: the layers after `tied_at` and its outside code's backward, then its own window
        and the layers before ([Note: where the root's tied gradient appears])."""
        t = self.tied_at

        def own(k, b, after):
            if k == t:
                return b.act + b.bws - b.outside if after else b.act + b.ows + self._flight_after(k)
            return b.backward_own(b.bws, self._flight_after(k)) if (k < t) == after else None
        return tuple(self._layer_by_layer(lambda k, b: own(k, b, after)) for after in (False, True))

    def forward_peak(self) -> int:
        """Its own activations and transients at the peak of its forward when not
        checkpointed: layer k produces its tensors (`LayerBytes.produced`, measured) next to
        the activations of layers 0..k. The last layer's outside code (the loss) has not
        saved yet: it runs after the unit reshards."""
        if not self.layer_bytes:
            return self.activation_bytes + self.workspace_bytes // 2
        return self._layer_by_layer(lambda k, b: b.act + b.produced + b.code)

    def _layer_by_layer(self, own) -> int:
        """The most over k of the activations of layers 0..k-1 and `own(k, b)` of layer k (its
        activations and more; None: no moment), the last layer's outside code's saved bytes not
        counted."""
        best, before, last = 0, 0, len(self.layer_bytes) - 1
        for k, b in enumerate(self.layer_bytes):
            mine = own(k, b)
            if mine is not None:
                best = max(best, before + mine - (self.outside_activation_bytes if k == last else 0))
            before += b.act
        return best

    def layer_grad(self, k: int, grad_bytes: float, *, in_place: bool = False) -> int:
        """The unsharded gradients layer k's backward adds: its parameters', or accumulating in
        place (`Scenario.accumulates_in_place`) its largest parameter's, the rest already held
        (`sim.memory.own_grad_bytes`)."""
        if in_place and len(self.layer_dims) == len(self.layer_bytes):
            return int(max((numel for _, numel in self.layer_dims[k]), default=0) * grad_bytes)
        return int(self.layer_bytes[k].params * grad_bytes)

    def _posts(self) -> frozenset[int]:
        """Its layers whose post-backward FSDP2 runs, the first always (it reduces as the unit's
        backward ends: [Note: modules with no post-backward])."""
        return self._memo("posts", lambda: frozenset(k for k, b in enumerate(self.layer_bytes) if k == 0 or b.posts))

    def _posting(self) -> tuple[list[int], int]:
        """(per layer k: the first layer after k that runs its post-backward, the layer count
        where none does; the last that does, the first to reduce)."""
        def make():
            posts, nxt, after = self._posts(), [], len(self.layer_bytes)
            for k in range(len(self.layer_bytes) - 1, -1, -1):
                nxt.append(after)
                after = k if k in posts else after
            return nxt[::-1], max(posts, default=0)
        return self._memo("posting", make)

    def _memo(self, key, make):
        """`make()`, once per unit: the figures depend on its fields only, which are frozen
        (the planner reads them at every moment of every schedule it scores)."""
        memo = self.__dict__.setdefault("_memo_", {})  # not a field: equality and `replace` ignore it
        if key not in memo:
            memo[key] = make()
        return memo[key]

    def first_reduce(self) -> int:
        """Its layer whose post-backward reduces first (its last, unless its last layers run none)."""
        return self._posting()[1]

    def last_end(self, grad_bytes: float, *, checkpointed: bool, in_place: bool = False) -> int:
        """Its own bytes at the end of its last layer's backward (the first to run backward):
        that layer's unsharded gradients and workspace next to the activations (kept bytes
        when checkpointed) of the layers before it; the previous unit's ReduceScatter input
        is held (the caller's). Where its last layers run no post-backward, the most of the
        moments until its first reduce, their gradients waiting beside the unit gathered
        ([Note: modules with no post-backward])."""
        bs, first = self.layer_bytes, self.first_reduce()
        before = sum(b.kept if checkpointed else b.act for b in bs[:-1])
        waiting = self.layer_grad(len(bs) - 1, grad_bytes, in_place=in_place)
        most = waiting + before + bs[-1].ws
        for k in range(len(bs) - 2, first - 1, -1):
            b = bs[k]
            before -= b.kept if checkpointed else b.act
            own = (b.kept if checkpointed else b.act) + b.ows + bs[k + 1].flight if b.outside else 0
            start = (b.redo if checkpointed else b.act) - b.outside + b.ws
            g = self.layer_grad(k, grad_bytes, in_place=in_place)
            most = max(most, before + waiting + max(own, start, g + b.ws))
            waiting += g
        return most

    def inner_moments(self, grad_bytes: float, *, checkpointed: bool,
                      in_place: bool = False) -> dict[tuple[str, int], Inner]:
        """The moments of a fused unit's backward after its last layer's end, as FSDP2 (torch
        2.13) runs it module by module: layer k's backward ends with its unsharded gradients
        and workspace next to the activations of layers 0..k-1, while layer k+1's ReduceScatter
        input is held and layers k+1.. hold their reduced (sharded) gradients (and as it starts,
        its activations are live next to its workspace: a BatchNorm CNN was 9% under without
        that moment); layer k reduces;
        checkpointed, layer k is recomputed (its live bytes) next to the kept inputs of the
        layers before it; a module's pre-backward gathers again (FSDP2 resharded after the
        module before), its AllGather output next to the activations of layers 0..k, the
        gradient of its output (`LayerProfile.output_bytes`) and those in flight around it
        (`LayerProfile.flight_bytes`: a Mixer's residual gradient, 3.0% under without it); a
        module reduces after FSDP2 resharded the whole unit, none of its unsharded parameters live (`Inner.resharded`:
        charged gathered, a GroupNorm CNN's fused head was 8% over). A module that runs no
        post-backward neither reduces nor reshards: its gradients wait for the next reduce
        ([Note: modules with no post-backward]). Keyed by
        (moment, k) so plain and checkpointed moments pair up (`solve.milp`). Charging the
        whole unit's gradients next to its largest workspace over-predicted fused HF decoders
        by 12-18%; charging every module's sharded gradients from the start, 5% on a Mixer."""
        out, before, layers = {}, 0, self.layer_bytes
        (nxt, first), posts = self._posting(), self._posts()
        tied = lambda k: self.tied_at is None or k <= self.tied_at  # noqa: E731 (it exists at layer k)
        grads = [int(b.params * grad_bytes) for b in layers]
        for k, b in enumerate(layers):
            g, r, wait = grads[k], nxt[k], sum(grads[k + 1:nxt[k]])  # `wait`: made, not reduced yet
            if k < first:  # the moments before its first reduce are `last_end`'s
                out["end", k] = Inner(g + wait + before + b.ws, r, k, False, tied=tied(k))
                if not checkpointed:  # its backward starts: its activations still live
                    out["start", k] = Inner(wait + before + b.act - b.outside + b.ws, r, k, False, tied=tied(k))
                else:
                    out["redo", k] = Inner(wait + before + b.redo - b.outside + b.ws, r, k, False, tied=tied(k))
                if b.outside:  # [Note: the code between a fused unit's layers], beside the gradients in
                    # flight ([Note: the backward of code between layers])
                    code = before + (b.kept if checkpointed else b.act) + b.ows + layers[k + 1].flight
                    out["code", k] = Inner(wait + code, r, k, False, k + 1 in posts,
                                           tied=tied(k) and k != self.tied_at)
                if k + 1 in posts:  # the gradient of its output has arrived: live as it gathers
                    out["regather", k] = Inner(before + (b.kept if checkpointed else b.act - b.outside) + b.out
                                               + b.flight, r, k, True, tied=tied(k))
            if b.calls > 1 and k + 1 < len(layers):  # a repeated layer's earlier call, its later layers
                for key, gathered in (("recall", True), ("recall_redo", False)):  # reduced ([Note: a
                    out[key, k] = Inner(wait + before + _recall_own(b, checkpointed, gathered) + g,  # repeated
                                        first if k >= first else r, k, gathered)  # module's later calls])
            if k in posts:  # accumulating in place, the first to reduce added into the gradients held
                # whole; the layers after the unit's reduce make theirs anew
                out["reduce", k] = Inner((0 if in_place and k == first else g + wait) + before, k, k, False, True,
                                         output=not in_place, tied=tied(k))
            before += b.kept if checkpointed else b.act
        return out

    def layer_reduce_bytes(self, n: int, reduce_bytes: float) -> list[int]:
        """Each layer's ReduceScatter input over n shards, in bytes: FSDP2 pads every
        parameter's dim 0 to a multiple of n (a CNN's 24 channels reduce as 64 at world 64:
        counting them unpadded was 7% under). Without per-layer dims, its parameters. A layer
        that runs no post-backward reduces with the layer before it (0 here)."""
        shards, (nxt, _), posts = self._layer_shards(n), self._posting(), self._posts()
        return [int(n * sum(shards[k:nxt[k]]) * reduce_bytes) if k in posts else 0 for k in range(len(shards))]

    def reduce_extra_bytes(self, n: int, reduce_bytes: float, grad_bytes: float) -> list[int]:
        """Per layer: what its reduce holds beyond its input and the gradients it reduces, as
        `sim.memory.reduce_moment_bytes` holds for a unit (the output, 1/n of the input, beside
        the last parameter's gradient, FSDP2's parameter order: its segment's last layer's); a
        bot-first DLRM's final reduce, its 512 KB table the last, was 5.5% under without it."""
        rs, (nxt, _) = self.layer_reduce_bytes(n, reduce_bytes), self._posting()
        dims = self.layer_dims if len(self.layer_dims) == len(self.layer_bytes) else ()
        out = []
        for k, b in enumerate(self.layer_bytes):
            last = next((d[-1][1] for d in reversed(dims[k:nxt[k]]) if d), 0) if dims else 0
            made = sum(int(x.params * grad_bytes) for x in self.layer_bytes[k:nxt[k]])
            out.append(max(0, rs[k] // n + int(last * grad_bytes) - made) if rs[k] else 0)
        return out

    def done_grad_bytes(self, n: int, grad_bytes: float) -> list[int]:
        """Per layer k: the sharded gradients of the layers reduced before k's backward ends
        (those after k, but for the ones waiting for k's reduce), over n shards."""
        shards, out, after = self._layer_shards(n), [], 0
        for shard in reversed(shards):
            out.append(int(after * grad_bytes))
            after += shard
        out = out[::-1]  # out[j]: the layers after j
        nxt = self._posting()[0]
        return [out[nxt[k] - 1] for k in range(len(shards))]

    def _layer_shards(self, n: int) -> list[float]:
        """Per layer, its gradient's elements per worker over n shards: those of its parameters
        that get one, in proportion within a partly frozen or unused layer."""
        dims = self.layer_dims if len(self.layer_dims) == len(self.layer_bytes) else [()] * len(self.layer_bytes)
        return self._memo(("shards", n), lambda: [
            shard_numel(t, d, n) * min(1.0, b.params / t) if (t := sum(x for _, x in d)) else b.params / n
            for d, b in zip(dims, self.layer_bytes)])

    def shard_numel(self, n: int) -> int:
        """Elements per worker sharded n ways (dim 0 of each parameter padded)."""
        return shard_numel(self.params, self.dims, n)

    def trainable(self, numel: int, *, bucket: bool = False) -> int:
        """Of `numel` elements of this unit (a shard, a padded buffer), those that get a gradient
        (`bucket`: a slot in DDP's bucket, unused ones too: [Note: parameters a step never uses]
        in profile/unused.py): in proportion, as FSDP2 lays frozen and trainable parameters side
        by side ([Note: frozen parameters] in sim/memory.py)."""
        none = self.frozen_params + (0 if bucket else self.unused_params)
        return numel * (self.params - none) // self.params if none and self.params else numel

    def padded_numel(self, n: int) -> int:
        """Elements of the AllGather output / ReduceScatter input over n shards; the
        unsharded parameters are views into the AllGather output, so they occupy this too."""
        return n * self.shard_numel(n)


# [Note: modules with no post-backward]
# FSDP2 runs a module's post-backward (reshard the group, then `foreach_reduce` every gradient
# its parameters hold so far) from a `RegisterPostBackwardFunction` on the module's forward
# inputs that need a gradient (`FSDPParamGroup._register_post_backward_hook`); a module with
# none (an embedding fed indices, a Linear fed the batch: `LayerProfile.input_needs_grad`) never
# runs it. Inside a fused unit its gradients wait, unsharded, for the next module to run one,
# which reduces them with its own; the unit is not resharded between, so the module before
# it (in forward) does not gather again. The unit's first layer reduces as its backward ends
# whatever it is fed (its post-backward, ours in runtime/own_backward.py, or FSDP2's final
# callback). So a unit's layers fall into segments, each a layer that posts and the layers
# after it that do not: a segment reduces as one (`layer_reduce_bytes`), the moments before
# the unit's first reduce are `last_end`'s, and `done_grad_bytes` counts whole segments. A
# DLRM fused into one unit (a dense MLP, four tables, a top MLP) was 12.8% under its verified
# peak under shard_grad_op, its tables' gradients held as its first Linear gathered again.


def _recall_own(b, checkpointed: bool, gathered: bool) -> int:
    """A repeated layer's own bytes in its earlier calls' backward (`UnitCost.recall_bytes`):
    the saved (kept) bytes of the calls before, gathered beside the gradient of the call's
    output; computing, its workspace beside the call (checkpointed: recomputed, next to the
    kept inputs of the calls before it, one fewer than `LayerBytes.redo` holds at the last
    call's: the later call's input went with its backward; a block run twice under +ckpt,
    fused, was 3.2% over with it)."""
    own = b.kept if checkpointed else b.act
    if gathered:
        return own + b.out - own // b.calls
    return (b.redo - b.kept // b.calls if checkpointed else own - own // b.calls) + b.recall_ws


def outside_backward_bytes(units, i: int) -> int:
    """Unit i's `outside_workspace_bytes` (the backward of the code after its last layer) and
    the gradients in flight as the next unit's first layer starts its backward ([Note: the
    backward of code between layers]); 0 where it has no such code."""
    ows = units[i].outside_workspace_bytes
    if not ows or i + 1 >= len(units) or not units[i + 1].layer_bytes:
        return ows
    return ows + units[i + 1].layer_bytes[0].flight


# [Note: the backward of code between layers]
# Code between two layers (a residual sum and its pooling, an auxiliary loss) runs its backward
# after the later layer's window closes and before the earlier one's opens, beside the gradients
# in flight as the later one's opened: they wait for a sum that code makes (a deep-supervised
# CNN's pooled branch beside its auxiliary loss's: 7.5% under its verified peak without them).
# Measuring that gap's whole window instead counted the backward of whole modules run there (a
# layer object called again, an attention the root's code calls) beside what the memory model
# counts apart: 4-9% over.


def code_held_terms(units, i: int) -> list[tuple[int, int, int, int]]:
    """(earlier unit, bytes when it recomputes, when selectively under `+sac`, under
    `+sac-all`) of the outputs the calling
    code holds beside unit i's forward ([Note: outputs the caller's code holds] in
    profile/held.py); a layer of unit i's own is left out."""
    unit_of = {name: j for j, u in enumerate(units) for name in u.layers}
    return [(unit_of[name], t[0], t[1], t[-1]) for name, t in units[i].code_held.items()
            if unit_of.get(name, i) < i]
