"""Ops whose fake (meta) implementation disagrees with the CPU kernel that really runs.

Fake tensors run each op's meta function; where that refuses what the CPU kernel accepts, or
allocates less than the kernel does, profiles and verification would describe another
program than the one that trains. `FakeRules` sits directly above `FakeTensorMode` (so modes
above it see one op and one output) and answers those ops as the kernel would.

[Note: MoE experts on fake tensors] transformers' MoE models (Mixtral, Qwen2-MoE, OLMoE)
run their experts through `torch._grouped_mm` (`experts_implementation="grouped_mm"`,
transformers/integrations/moe.py). Its CPU kernel takes float32, but its meta function
(torch/_meta_registrations.py `_meta_grouped_mm_common`) insists on bfloat16, so a fake
trace in float32 fails. The output's shape does not depend on the dtype: it is taken from
the meta function on bfloat16 stand-ins and returned empty in the real dtype.

[Note: the fused RNN's workspace] `nn.LSTM` on CPU runs oneDNN's `mkldnn_rnn_layer`, whose
fourth output is the workspace backward reads (the gates and states of every time step),
saved for backward like an activation. Its meta function returns that workspace empty, so a
tied LSTM language model ran 4.5-6% (15.7 MiB) above its prediction. The size is oneDNN's
to decide (its own layout and padding), so it is asked: the kernel runs once on zeros of the
same shapes, outside fake mode, and the fake workspace gets the bytes it returned (cached by
shape; the zeros are the size of one layer's input and output).

[Note: a loss reduced in its own buffer] `F.mse_loss`, `smooth_l1_loss`, `binary_cross_entropy`
and `soft_margin_loss` compute the unreduced loss into a buffer the size of their input, reduce
it into its first element and return that buffer resized to 0 dimensions (shape (), not a view):
the scalar loss the caller holds through backward keeps the whole buffer. Their meta functions
return a 4-byte scalar, so a U-Net with an MSE loss ran 0.7% (its output's bytes) above its
verified peak on every worker. The kernel is asked, as for the RNN's workspace: once per shape,
on zeros outside fake mode, and the fake scalar gets a storage of the bytes it had (cached).

[Note: a cold fake-tensor cache] FakeTensorMode caches each op's fake outputs in one dict
shared by every mode of the process (`FakeTensorMode.cache`), and an output rebuilt from the
cache is not always the one the meta function gives: a 3-layer LSTM's backward workspace was
166,912 B on the first trace of a process and 167,936 B on every later one. So a profile or a
verification depended on what the process had traced before (a second `plan_model` in one
program, a profile cache hit), against the rule that answers depend only on inputs. Every
trace and every verification therefore starts from an empty cache (`cold_fake_mode`); ops
repeated within one run (a model's identical layers) still hit it.
"""
from __future__ import annotations

import functools

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_RNN_LAYER = getattr(_aten, "mkldnn_rnn_layer", None)
_REDUCED_IN_PLACE = {_aten.mse_loss.default, _aten.smooth_l1_loss.default, _aten.binary_cross_entropy.default,
                     _aten.soft_margin_loss.default}
"""Losses whose scalar keeps the unreduced buffer ([Note: a loss reduced in its own buffer])."""


@functools.lru_cache(maxsize=256)
def rnn_workspace_bytes(shapes: tuple, dtypes: tuple, rest: tuple) -> int:
    """Bytes of `mkldnn_rnn_layer`'s workspace for these input shapes ([Note: the fused RNN's workspace])."""
    with unset_fake_temporarily():
        args = [torch.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)]
        out = _RNN_LAYER.default(*args, *(list(r) if isinstance(r, tuple) else r for r in rest))
    return out[3].untyped_storage().nbytes()


@functools.lru_cache(maxsize=256)
def loss_storage_bytes(func, spec: tuple) -> int:
    """Bytes of the storage a reduced loss's scalar keeps ([Note: a loss reduced in its own
    buffer]); `spec`: per argument, (shape, dtype) of a tensor or the value itself."""
    with unset_fake_temporarily():
        args = [torch.zeros(a[1], dtype=a[2]) if isinstance(a, tuple) and a[:1] == ("tensor",) else a for a in spec]
        return func(*args).untyped_storage().nbytes()


def cold_fake_mode(*, allow_non_fake_inputs: bool) -> FakeTensorMode:
    """A FakeTensorMode whose op cache starts empty ([Note: a cold fake-tensor cache])."""
    FakeTensorMode.cache_clear()
    return FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)


class FakeRules(TorchDispatchMode):
    """See the module docstring. Any op that still fails is remembered (`failed`), so the
    error can name it."""

    def __init__(self):
        super().__init__()
        self.failed: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(isinstance(a, FakeTensor) for a in args):  # a trace on real tensors: the kernel answers
            return func(*args, **kwargs)
        try:
            if func is _aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
                a, b = (torch.empty(t.shape, dtype=torch.bfloat16) for t in args[:2])
                shape = func(a, b, *args[2:], **{**kwargs, "out_dtype": None}).shape
                return torch.empty(shape, dtype=kwargs.get("out_dtype") or args[0].dtype)
            out = func(*args, **kwargs)
            if _RNN_LAYER is not None and func is _RNN_LAYER.default and not kwargs and out[3].numel() == 0:
                return _with_workspace(out, args)
            if func in _REDUCED_IN_PLACE and out.dim() == 0 and not kwargs:
                return _with_buffer(func, out, args)
            return out
        except Exception:
            self.failed = self.failed or str(func)
            raise


def _with_workspace(out: tuple, args: tuple) -> tuple:
    tensors = [a for a in args[:7]]
    shapes = tuple(tuple(t.shape) for t in tensors)
    nbytes = rnn_workspace_bytes(shapes, tuple(t.dtype for t in tensors), tuple(_hashable(a) for a in args[7:]))
    return (*out[:3], torch.empty(nbytes, dtype=torch.uint8, device=out[3].device))


def _with_buffer(func, out: torch.Tensor, args: tuple) -> torch.Tensor:
    """`out` (a fake 0-dim loss) with the storage the kernel leaves it ([Note: a loss reduced in
    its own buffer])."""
    spec = tuple(("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
    nbytes = loss_storage_bytes(func, spec)
    if nbytes <= out.untyped_storage().nbytes():
        return out
    return torch.empty(nbytes // out.element_size(), dtype=out.dtype, device=out.device).resize_(())


def _hashable(a):
    return tuple(a) if isinstance(a, list) else a
