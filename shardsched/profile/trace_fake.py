"""The trace's fake world: a model's parameters, buffers and inputs as fake CPU tensors
(ties kept), the boolean masks that must stay real, and the loss read from whatever the
model returns (`profile.trace`)."""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.errors import UsageError
from shardsched.profile.trace_record import storage_key

_aten = torch.ops.aten

# [Note: HF causal masks on fake tensors]
# transformers (masking_utils.find_packed_sequence_indices) decides whether a batch packs
# several sequences per row by reading the position ids; it cannot read a fake tensor, so
# under FakeTensorMode it assumes packing and builds an explicit (batch, 1, T, T) mask, and
# SDPA then repeats K/V for grouped-query attention. Real tensors (the run) skip both:
# positions a model makes itself are one sequence per row. The trace traced another program
# than the one that runs (Llama with GQA: +9% activations). During the trace, a fake position
# tensor therefore counts as one sequence per row, as transformers answers for real ones.


@contextlib.contextmanager
def hf_one_sequence_per_row():
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def find(position_ids, *args, **kwargs):
        if isinstance(position_ids, FakeTensor):
            return None
        return original(position_ids, *args, **kwargs)

    masking.find_packed_sequence_indices = find
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


@contextlib.contextmanager
def quiet_fake_tensor_log():
    """FakeTensorMode logs a traceback for an op whose meta function raises before it
    re-raises (torch/_subclasses/fake_tensor.py); the error is reported in one line instead."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


# ---------------------------------------------------------------- fake copies

def _fake_like(t: torch.Tensor, dtype: torch.dtype, mode: FakeTensorMode) -> torch.Tensor:
    """An empty fake CPU tensor of `t`'s shape (floating tensors in the compute dtype)."""
    with mode:
        return torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="cpu",
                           requires_grad=isinstance(t, nn.Parameter) and t.requires_grad)


def fake_state(model: nn.Module, dtype: torch.dtype, mode: FakeTensorMode) -> dict[str, torch.Tensor]:
    """Fake parameters and buffers by name; a tensor reached by two names gets one fake."""
    by_id: dict[int, torch.Tensor] = {}
    state = {}
    items = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, t in items:
        if id(t) not in by_id:
            by_id[id(t)] = _fake_like(t, dtype, mode)
        state[name] = by_id[id(t)]
    return state


def untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with each tensor under its first name only: `functional_call(tie_weights=True)`
    ties the other names itself."""
    seen: set[int] = set()
    out = {}
    for k, t in state.items():
        if id(t) not in seen:
            seen.add(id(t))
            out[k] = t
    return out


# [Note: a checkpoint inside the model]
# A layer that calls `torch.utils.checkpoint` itself (HF's gradient checkpointing, a block that
# checkpoints its MLP) runs its forward again inside backward. `torch.func.functional_call`
# swaps the fake parameters in for the forward alone, so that recomputation met the real ones
# and the trace failed ("Please convert all Tensors to FakeTensors"): the model fell back to
# the measured profile, whose selective figures were 5-15% under what ran. The swap is held
# open through backward instead. The recomputation then runs the model's modules again inside
# backward: the profiler's module hooks skip it (`layers.in_forward`: it is no call of the step),
# and nothing the profiler hooks holds autograd nodes in a reference cycle (FlopCounterMode's
# module tracker and `register_multi_grad_hook` did), since a node of the checkpointed region
# whose backward never runs kept its saved tensors until Python's garbage collector ran: HF
# GPT-2's windows moved 30-140% with when that was. Its plans are now FSDP2's and DDP's peaks
# on real tensors (tests/verify/test_engine.py).
def fake_parameters(model: nn.Module, state: dict[str, torch.Tensor]):
    """`model`'s parameters and buffers swapped for `state` (fake, untied) until the block ends:
    `functional_call`'s own swap, kept through backward ([Note: a checkpoint inside the model])."""
    from torch.nn.utils.stateless import _reparametrize_module
    return _reparametrize_module(model, state, tie_weights=True)


@contextlib.contextmanager
def restored(model: nn.Module):
    """[Note: one module object at two places] `functional_call` swaps each name in and back
    out in turn; a module registered twice (`layers = [L0, L1, L0, L1]`) is swapped twice, so
    its second restore puts back the fake of the first swap, and the caller's model kept fake
    parameters (its next `.to()` failed). Every module's own tensors are put back here."""
    saved = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        yield
    finally:
        for m, params, buffers in saved:
            m._parameters.update(params)
            m._buffers.update(buffers)


def module_params(state: dict[str, torch.Tensor], modules: list[str]) -> dict[str, list[torch.Tensor]]:
    """Per module path, the (fake) parameters under it that need a gradient, each once."""
    out = {}
    for m in modules:
        ts = {id(t): t for k, t in state.items() if k.startswith(m + ".") and t.requires_grad}
        out[m] = list(ts.values())
    return out


def fake_copy_inputs(inputs: tuple, dtype: torch.dtype, mode: FakeTensorMode) -> tuple:
    return tuple(_fake_like(x, dtype, mode) if isinstance(x, torch.Tensor) else x for x in inputs)


# [Note: a trace on real tensors]
# A model whose own code reads values it computes (an MoE's router picking each expert's tokens
# with `torch.where`, a mask made from the inputs, `.item()`) cannot run on fake tensors. Its
# bytes were those `profile/measure.py` sees from module hooks, which miss what the trace
# records (windows, what selective checkpointing keeps): a top-2 MoE LM was predicted 2.9%
# under its full_shard peak and 31% over its +sac peak. The same trace runs on real copies of
# the parameters and inputs instead (`real_state`, `real_copy_inputs`): every hook, mode and
# storage count is the fake trace's, only the kernels run. It costs a real forward and
# backward and three forwards on this machine, each pass from the same seed so random ops
# (dropout) route the same tokens in every pass.

def real_state(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Real copies of the parameters and buffers (floating ones in `dtype`), ties kept, the
    model's own left untouched (the backward writes the copies' gradients)."""
    by_id: dict[int, torch.Tensor] = {}
    state = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(t) not in by_id:
            copy = t.detach().to(dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
            by_id[id(t)] = copy.requires_grad_(isinstance(t, nn.Parameter) and t.requires_grad)
        state[name] = by_id[id(t)]
    return state


def real_copy_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(x.detach().to(dtype=dtype if x.is_floating_point() else x.dtype, copy=True)
                 if isinstance(x, torch.Tensor) else x for x in inputs)


@contextlib.contextmanager
def seeded(real: bool):
    """Each pass of a real trace from the same random state, torch's, Python's and numpy's
    (transformers draws SpecAugment's masks with numpy): [Note: a trace on real tensors]."""
    if not real:
        yield
        return
    import random
    np = sys.modules.get("numpy")
    py_state, np_state = random.getstate(), np.random.get_state() if np is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            random.seed(0)
            if np is not None:
                np.random.seed(0)
            yield
    finally:
        random.setstate(py_state)
        if np is not None:
            np.random.set_state(np_state)


# [Note: boolean masks on fake tensors]
# A loss that reads a boolean mask (`logits[mask]`, `y[mask]`: a GNN's training nodes, a
# masked-LM's positions) has an output whose length is the mask's count: a fake tensor has no
# values, so `aten.index` failed (DynamicOutputShapeException on nonzero) and the model was
# profiled by running it for real (`profile/measure.py`), whose profile lacks the selective and
# window fields (a GNN's full_shard+sac plan was 33% over its verified peak). A mask that is one
# of the model's inputs (or a view of one) has its values in the caller's example inputs, so
# `_RealMasks` answers those ops from them: the mask's count on the real tensor, the op on fake
# integer indices of that length (what `nonzero` turns the mask into). Autograd saves the op's
# arguments above this mode (the mask, an input: no bytes), so what the trace counts is the
# program's. A mask the model computes from its inputs still cannot trace.

_aten = torch.ops.aten
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}


class _RealMasks(TorchDispatchMode):
    """Directly above FakeTensorMode: boolean-mask indexing by a mask the inputs hold."""

    def __init__(self, real: dict[int, torch.Tensor]):
        super().__init__()
        self.real = real  # fake input's storage key -> the real input (contiguous)

    def _real(self, t) -> tuple[int, int] | None:
        """(true count, dims) of a mask the inputs hold, else None."""
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bool:
            return None
        r = self.real.get(storage_key(t))
        if r is None:
            return None
        with unset_fake_temporarily():
            return int(r.as_strided(t.shape, t.stride(), t.storage_offset()).sum()), t.dim()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEXING and len(args) > 1 and any(self._real(i) is not None for i in args[1]):
            indices = []
            for i in args[1]:
                r = self._real(i)
                if r is None:
                    indices.append(i)
                    continue
                indices += [torch.empty(r[0], dtype=torch.long, device=i.device) for _ in range(r[1])]
            args = (args[0], indices, *args[2:])
        elif func is _aten.nonzero.default and self._real(args[0]) is not None:
            r = self._real(args[0])
            return torch.empty(r, dtype=torch.long, device=args[0].device)
        return func(*args, **kwargs)


def real_masks(inputs: tuple, fake_inputs: tuple) -> _RealMasks:
    return _RealMasks({storage_key(f): r.detach().contiguous() for r, f in zip(inputs, fake_inputs)
                       if isinstance(r, torch.Tensor) and r.dtype == torch.bool and isinstance(f, torch.Tensor)})


def loss_of(out: Any) -> torch.Tensor:
    """The scalar loss a model's forward returns, or holds ([Note: a forward that returns more
    than the loss] in models/spec.py); UsageError (one line) otherwise."""
    from shardsched.models.spec import picked_loss
    loss = picked_loss(out)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = type(out).__name__ if not isinstance(out, torch.Tensor) else f"a tensor of shape {tuple(out.shape)}"
        raise UsageError(f"model(*example_inputs) must return the scalar loss, got {got}; "
                         f"accepted: a builder whose model returns its loss")
    return loss.reshape(())


