"""What a checkpointed layer keeps between its forward and its backward, and what it holds while
it is recomputed (`plan.units.layer_bytes` reads them into `LayerBytes.kept` and `.redo`)."""
from __future__ import annotations

from shardsched.profile.types import LayerProfile


def kept_when_checkpointed(layer: LayerProfile) -> int:
    """A checkpointed layer's inputs, and what code outside it saved (not recomputed), its
    own saved outputs among them (`LayerProfile.outside_kept_bytes`)."""
    return own_inputs(layer) + layer.outside_bytes + layer.outside_kept_bytes


def kept_in_unit(layers: list[LayerProfile], k: int) -> int:
    """`kept_when_checkpointed` of layer k of a unit, less its inputs an earlier layer took too
    (`input_shared_bytes`): the first keeps the storage, and the others' checkpoints hold the
    same one (a T5-style bias every block reads, fused under full_shard+ckpt, was counted once
    per block: 11% over). The unit's first layer keeps its own: the earlier layer that took it
    may be another unit's, not checkpointed."""
    return kept_when_checkpointed(layers[k]) - shared_input(layers, k)


def shared_input(layers: list[LayerProfile], k: int) -> int:
    """Of layer k's kept inputs, those an earlier layer of its unit keeps (`kept_in_unit`)."""
    return min(layers[k].input_shared_bytes, own_inputs(layers[k])) if k else 0


def own_inputs(layer: LayerProfile) -> int:
    """Its inputs that it keeps when recomputed, less what code outside every layer saved
    first (kept by that code: counted in the activations it is folded into; a residual CNN
    after an `nn.Sequential` stem with its ReLU between layers was 9% over counting it again)."""
    return max(0, layer.input_bytes - layer.input_saved_outside_bytes)


def recomputed_bytes(layer: LayerProfile) -> int:
    """Live bytes of a checkpointed layer while one of its calls is recomputed: what it saves,
    and its kept input where an earlier layer's own code saved it (`LayerProfile.
    input_saved_before_bytes`: a conv block after a ReLU-ending block ran 6% above its
    prediction as that input was left out; one after a ReLU outside the layers, 9.7% below
    when its kept input was counted again) or where nothing saves it (`unsaved_input`)."""
    c = max(1, layer.calls)
    kept = kept_when_checkpointed(layer)
    if c > 1:
        return layer.activation_bytes // c + kept - kept // c
    return layer.activation_bytes + layer.input_saved_before_bytes + unsaved_input(layer)


def recompute_live(layer: LayerProfile) -> int:
    """What a checkpointed layer holds at the peak of its recomputation, beside the gradient of
    its output: its kept input and its forward up to its last save (`recompute_peak_bytes`).
    Paired with its workspace everywhere (`LayerBytes.redo` + `ws`), it stands in for the redo
    moment where it is more: a bidirectional GRU's per-step outputs, live until the last step,
    were 9.7% under its verified peak under full_shard+ckpt with its saved bytes alone. 0 where
    unmeasured, or for a repeated layer (`recomputed_bytes` per call)."""
    if not layer.recompute_peak_bytes or layer.calls > 1:
        return 0
    return recomputed_bytes(layer) - layer.activation_bytes + layer.recompute_peak_bytes + layer.output_bytes


def unsaved_input(layer: LayerProfile) -> int:
    """Of its (first call's) inputs, those nothing saved before it ran and its own code does
    not save: an `nn.LSTM` saves a time-major copy of its (B, T, d) input, not the input.
    Checkpointed, the layer keeps them beside all it recomputes (a tied LSTM LM was 1.7% under
    its verified peak at the recomputed LSTM's backward without them); 0 where unknown."""
    if layer.input_saved_bytes is None:
        return 0
    return max(0, layer.entry_bytes - layer.input_saved_bytes)
