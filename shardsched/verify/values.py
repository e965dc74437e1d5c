"""The model's own values in the gathered parameters of a run on the fake process group.

[Note: real values on the fake process group]
The fake process group runs no collective: FSDP2 copies this rank's shard into its slot of the
AllGather output and the other ranks' slots keep whatever the allocator left there. A fake-tensor
run has no values, so nothing reads them; a model verified on real tensors because its own code
reads values (an MoE's router, a mask it computes: [Note: models that cannot run on fake tensors]
in verify/subject.py) then routed tokens by weights three quarters garbage at world 4, and its
verified peak described another batch than the plan's (a masked-MLP LM's moved 0.5% when its
weights were its own). So every module's gathered parameters get the model's values before its
forward (`own_values`), as every rank's true shard would give them: in place through `.data`,
which allocates nothing and leaves autograd's version counter alone (a layer called twice saves
its weight at the first call). Each step's forward sees the model's first values, as the trace did.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes


def own_values(model: nn.Module) -> list:
    """Before `parallelize`: a copy of every parameter, and forward pre-hooks that write it into
    the module's gathered (plain) parameters; returns the hooks' handles."""
    handles = []
    for path, module in model.named_modules():
        params = {n: p.detach().clone() for n, p in module.named_parameters(recurse=False)}
        if params:
            handles.append(module.register_forward_pre_hook(_writer(params)))
    return handles


def _writer(params: dict[str, torch.Tensor]):
    def write(module: nn.Module, args) -> None:
        # below every dispatch mode: a checkpoint's recomputation (gathered again, so written
        # again) must not see an op its forward did not run; the copy allocates nothing to track
        with _disable_current_modes(), torch.no_grad():
            for name, value in params.items():
                p = getattr(module, name)
                if isinstance(p, torch.Tensor) and not isinstance(p, DTensor) and p.shape == value.shape:
                    p.data.copy_(value.to(p.dtype))
    return write
