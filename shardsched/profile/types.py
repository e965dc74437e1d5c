"""Profile: what the planner knows about a model, layer by layer.

A profile is traced on fake tensors (`profile.trace`, the default for code), measured
on this machine (`profile.measure`, an option) or derived analytically
(`profile.analytic`) from a GPT config and a device spec. Either way it is the same
frozen, JSON-round-tripping data. The layer "" is the root unit (parameters no
layer owns, tied sets spanning layers).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from shardsched._json import from_dict, to_dict


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One layer: an atomic module in execution order."""

    name: str
    """Module path as `model.named_modules()` spells it, e.g. "blocks.3"."""
    params: int
    """Number of parameters (elements, not bytes) owned by this layer."""
    frozen_params: int = 0
    """Of `params`, elements with `requires_grad=False` (Pegasus' sinusoidal position tables,
    a frozen backbone): stored and gathered like the others, but given no gradient and no
    optimizer state ([Note: frozen parameters] in sim/memory.py)."""
    unused_params: int = 0
    """Of `params`, elements that need a gradient but got none in the traced step (a Linear
    the forward never calls, DINOv2's `mask_token` without a mask): no gradient under FSDP2,
    a DDP bucket slot, no optimizer state ([Note: parameters a step never uses] in
    profile/unused.py)."""
    forward_seconds: float
    """Forward compute time for one micro-batch."""
    backward_seconds: float
    """Backward compute time for one micro-batch (about 2x forward for matmuls)."""
    forward_ops: int = 0
    """Operators its forward dispatches (aten ops, as a `TorchDispatchMode` and selective
    checkpointing see them): the unit of the host's time per op ([Note: host time per op] in
    plan/schedule.py). 0 = unknown (no host time priced)."""
    activation_bytes: int
    """Bytes the layer's forward keeps alive for its backward (saved tensors)."""
    workspace_bytes: int = 0
    """Transient bytes of the layer's backward on top of max(its activations, its
    gradients): the incoming gradient, activation gradients, weight gradients, less
    what it frees as it goes; measured (`profile.workspace`, [Note: what the backward
    workspace is]) or derived (`profile.analytic`). 0 = unknown (the planner then
    assumes half its activations)."""
    input_bytes: int = 0
    """Bytes of the layer's forward inputs: what a checkpointed layer keeps for its
    backward instead of `activation_bytes` (it recomputes the rest). 0 = unknown."""
    outside_bytes: int = 0
    """Of `activation_bytes`, what code outside the layer's module saved and the
    profilers folded into it (a loss or a tied head after the last layer, a dropout
    between layers): checkpointing the layer does not recompute that code, so a
    checkpointed layer keeps these bytes next to its inputs."""
    outside_kept_bytes: int = 0
    """What code outside the layer's module saved again after the layer's own code saved it
    first (a pooling after a conv block saves the block's ReLU output): in
    `activation_bytes` once, as the layer's own, yet kept by that code when the layer
    recomputes ([Note: what outside code saves again] in profile/trace.py). 0 = none or unknown."""
    input_saved_bytes: int | None = None
    """Of its (first call's) inputs, what its own code saved first, so `activation_bytes`
    counts it (a block's first norm saves the residual stream); an input an earlier layer saved
    (a ReLU's output before a conv) is counted there. A recomputed layer keeps its inputs
    beside what it recomputes. None = unknown (taken as all of them)."""
    input_saved_before_bytes: int = 0
    """Of its (first call's) inputs, what an earlier layer's own code saved first (the ReLU
    ending the block before): counted in that layer's activations only, so a recomputed layer
    holds it beside what it recomputes (`plan.kept.recomputed_bytes`). An input code outside
    every layer saved (a ReLU between `nn.Sequential` layers) is that code's, kept anyway."""
    input_resaved_bytes: int | None = None
    """Of `input_saved_before_bytes`, what its own code saves again (a conv after a ReLU saves
    the ReLU's output; a message-passing layer gathers from its input and saves none of it):
    held by this layer's saved tensors when the layer before recomputes ([Note: the output a
    recomputed unit hands over] in sim/scenario.py). None = unknown (all of it)."""
    input_saved_outside_bytes: int = 0
    """Of its (first call's) inputs, what code outside every layer saved first (a ReLU between
    `nn.Sequential` layers): in the activations of the layer that code is folded into, kept
    whatever recomputes, so a checkpointed layer's kept inputs leave it out
    (`plan.kept.kept_when_checkpointed`)."""
    input_shared_bytes: int = 0
    """Of its (first call's) inputs, the storages an earlier layer took as an input too (a
    T5-style attention bias, an encoder's output every decoder layer reads): checkpointed
    layers of one unit keep such a storage once (`plan.kept.kept_in_unit`)."""
    code_held: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per earlier layer, (bytes when it recomputes, when selectively under `+sac`, under
    `+sac-all`; older profiles: the first two) of its
    outputs that the calling code still holds as this layer's forward starts and that only
    that layer's own code saves ([Note: outputs the caller's code holds] in
    profile/held.py): live beside this layer's forward moments when that layer recomputes."""
    code_held_bytes: int = 0
    """Earlier layers' outputs the calling code holds as this layer starts that nothing saved
    by then: live beside its forward moments whatever recomputes."""
    held_to_save_bytes: int = 0
    """Earlier layers' outputs the calling code holds as this layer starts that the code after
    it saves first (an einsum reading q's output after k): live at its copy-out and as its
    module starts, in its activations from its compute on ([Note: outputs code after a later
    layer saves] in profile/held.py)."""
    makes_tied_grad: bool = False
    """Its backward, or its outside code's, is where the gradient of a tensor the root owns
    under two names first appears (a tied head read after it): the moments before hold none
    ([Note: where the root's tied gradient appears] in profile/trace.py); False everywhere:
    the last layer's (`sim.memory.root_grad_bytes`)."""
    outside_workspace_bytes: int = 0
    """Transient bytes of the backward of the code outside the layer folded into it (a loss,
    a tied head after the last layer), which runs before the layer's own backward and before
    FSDP2 gathers its unit for backward (`sim.memory`): two of the largest tensor that code
    saved. 0 = none, or included in `workspace_bytes` (analytic profiles)."""
    forward_peak_bytes: int = 0
    """Peak of its forward above the live bytes at its start (its output, saved tensors and
    transients), measured ([Note: forward windows] in profile/workspace.py); 0 = unknown
    (the planner then takes half the backward workspace as the transient)."""
    recompute_peak_bytes: int = 0
    """`forward_peak_bytes` as of the last tensor its forward saves for backward: what its
    recomputation holds above its kept input, as non-reentrant checkpointing stops there
    (`_StopRecomputationError` in torch/utils/checkpoint.py) before the transients after it
    (a GRU's per-step outputs stacked and concatenated); 0 = unknown."""
    checkpointed_forward_bytes: int = 0
    """Peak of its forward above its start when it saves nothing, as a checkpointed layer runs
    (measured under `no_grad`, [Note: forward windows]); 0 = unknown."""
    entry_bytes: int = 0
    """Its (first call's) inputs that nothing saved before it runs (a residual sum, which no
    op saves): live next to what earlier layers saved when its unit's AllGather copies out,
    before it runs and saves them itself (`sim.memory._forward`); 0 = unknown."""
    exit_bytes: int = 0
    """The most the code after its forward holds beyond what is saved, up to the next layer's
    (or child's) pre-forward, or the loss ([Note: exit windows] in profile/workspace.py): its
    output next to a residual sum, the loss's logits-sized temporaries. Live next to everything
    saved through it while its unit's AllGather output is still held (`sim.memory._forward`);
    0 = unknown."""
    output_bytes: int = 0
    """Bytes of its (largest call's) output: the gradient its backward receives has this size
    (`sim.scenario.UnitCost.inner_moments`); 0 = unknown."""
    selective_saved_bytes: int | None = None
    """Bytes of the outputs of the ops selective checkpointing (`+sac`, `core.sac_policy.Policy`)
    saves (attention, convolutions, every other matmul) in its forward, each storage once: what a selective
    layer keeps next to its inputs (SAC's caching mode stores them whether or not autograd
    would save them). None = unknown (the planner then assumes it keeps all its activations)."""
    selective_outside_input_bytes: int = 0
    """Of `selective_saved_bytes`, what code outside the layer then reads (a `+sac` head's
    logits, the loss's input): at that code's forward they are its input, which the planner's
    loss transient already counts ([Note: selective checkpointing as kept bytes])."""
    selective_forward_bytes: int = 0
    """Peak of its forward above its start as a selective layer runs (saving nothing for
    autograd, keeping the policy's outputs: measured, [Note: forward windows]); 0 = unknown
    (the planner then takes `checkpointed_forward_bytes` plus all its saved outputs)."""
    selective_recompute_seconds: float | None = None
    """Forward seconds of the ops selective checkpointing recomputes (all but those it saves:
    mostly memory-bound ones, priced by their moved bytes). None = unknown (its whole forward)."""
    selective_all: tuple[float, ...] = ()
    """(`selective_saved_bytes`, `selective_outside_input_bytes`, `selective_forward_bytes`,
    `selective_recompute_seconds`) under `+sac-all`, the policy that keeps every matmul's
    output (`core.sac_policy`); the four fields above are `+sac`'s, torchtitan's op policy.
    Empty = unknown (the planner then takes `+sac`'s, which keep less: a lower bound)."""
    selective_input_stored_bytes: tuple[int, ...] = ()
    """(`+sac`, `+sac-all`): of its inputs, what the layer called just before it stores under
    that policy ([Note: an input an earlier layer's policy stores] in plan/units.py: a storage
    an earlier layer stored, an encoder's output every decoder layer takes, is left out, as
    `input_shared_bytes` counts it); () = unknown (none)."""
    calls: int = 1
    """Times its module runs in one forward (ALBERT's shared layer: once per depth).
    Parameters and workspace count once; `activation_bytes` and `input_bytes` are the
    sums over its calls ([Note: repeated modules] in plan/units.py)."""
    input_needs_grad: bool = True
    """Whether one of its forward inputs needs a gradient. FSDP2 runs a module's post-backward
    (reshard, reduce) from a hook on those inputs, so a module with none (an embedding fed
    indices, a Linear fed the batch) never runs it: inside a fused unit its gradients wait,
    unsharded, for the next module's post-backward, and the unit stays gathered meanwhile
    ([Note: modules with no post-backward] in sim/unit_cost.py)."""
    bucketed_workspace_bytes: int = 0
    """`workspace_bytes` as DDP runs the backward: each parameter's gradient leaves for the
    bucket as it is accumulated ([Note: bucketed windows] in profile/workspace.py), measured
    above its activations; 0 = unknown (`workspace_bytes` then stands for it)."""
    flight_bytes: int = 0
    """Gradients in flight beside it as its backward starts, beyond its incoming gradient (a
    residual branch's, waiting to be summed: [Note: gradients held beside a window] in
    profile/workspace.py); part of `workspace_bytes`, and live as FSDP2 gathers it again. 0 =
    none or unknown."""
    recall_workspace_bytes: int = 0
    """A repeated module: `workspace_bytes` of its calls after the first to run backward,
    whose windows start above the gradient the first accumulated (its own is produced into
    it, not held beside it: [Note: a repeated module's later calls] in plan/units.py). 0 =
    unknown or not repeated (`workspace_bytes` then stands for it)."""
    children: tuple["LayerProfile", ...] = ()
    """Parameter-holding children, for tensor partitioning of a large layer."""
    dims: tuple[tuple[int, int], ...] = ()
    """(dim-0 size, numel) of each parameter the layer owns: FSDP2 pads every
    parameter's dim 0 to a multiple of the shard count. Empty = unknown (the
    memory model then rounds the layer's total up instead)."""
    forward_flops: dict[str, float] = field(default_factory=dict)
    """Traced forward FLOPs per op class ("matmul", "attention", "conv")."""
    backward_flops: dict[str, float] = field(default_factory=dict)
    """Traced backward FLOPs per op class."""
    forward_moved_bytes: int = 0
    """Bytes read and written by the forward's memory-bound ops (no FLOPs counted)."""
    backward_moved_bytes: int = 0
    """Bytes read and written by the backward's memory-bound ops."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Per-layer costs of one model for one micro-batch."""

    model: str
    """A human name: preset name, `gpt:...` spec or `python:module:function`."""
    layers: tuple[LayerProfile, ...]
    """Layers in forward execution order."""
    fingerprint: str
    """Hash of the model structure (parameter names and shapes); see `fingerprint`."""
    compute_dtype: str = "float32"
    """Dtype the times and activation bytes were taken in: float32 or bfloat16."""
    micro_batch: int = 1
    """Sequences per worker per step that the times and activations refer to."""
    seq: int = 0
    """Tokens per sequence (0 when the model has no notion of one)."""
    input_bytes: int = 0
    """Bytes of the example inputs (tokens, targets) held through the step."""
    source: str = "analytic"
    """"traced", "measured" or "analytic"."""
    tied: tuple[tuple[str, ...], ...] = ()
    """Tied sets: the names of each parameter reachable by more than one name
    (tied embeddings). Each lives whole in one layer, or in the root layer "",
    and is counted once (profile/layers.py, [Note: the root unit and tied parameters])."""
    root_tied_numel: int = 0
    """Elements of the tied tensors the root layer owns: their gradient sums a use at the end
    of forward (a tied head) with one at its start, so it is live through all of backward,
    on DDP too (`sim.memory` [Note: plans that run on DDP])."""
    buffer_bytes: int = 0
    """Bytes of the model's buffers (BatchNorm running statistics, masks, rotary tables):
    FSDP2 and DDP keep them whole on every worker, all step long."""
    loss_bytes: int = 8
    """The loss the caller holds through backward and the gradient `backward()` seeds it with:
    two scalars, or more where the loss keeps its unreduced buffer ([Note: a loss reduced in its
    own buffer] in profile/fake_rules.py: an MSE loss keeps its input's size)."""
    extra: dict = field(default_factory=dict)
    """Free-form provenance (device, config)."""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def without_selective(self) -> "Profile":
        """This profile with what selective checkpointing keeps unknown: `auto` then offers no
        `+sac` ([Note: a plan the engine cannot run] in verify/loop.py)."""
        return dataclasses.replace(self, layers=tuple(dataclasses.replace(layer, selective_saved_bytes=None)
                                                      for layer in self.layers))

    def to_json(self) -> str:
        return json.dumps(to_dict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        return from_dict(cls, json.loads(text))
