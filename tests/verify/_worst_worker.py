"""Worker side of `test_worst_worker`: each of 4 gloo workers runs every plan for real, as
the trainer runs it (AdamW foreach, `zero_grad(set_to_none=True)`), and reports its own
peak (module-level, so spawned workers can unpickle it)."""
from __future__ import annotations

import json

import torch

from shardsched.core.types import Plan
from shardsched.models.spec import parse_model_spec
from shardsched.runtime.memtrack import tracked_peak
from shardsched.runtime.parallelize import parallelize
from shardsched.runtime.scalars import optimizer_param_groups
from shardsched.verify.engine import training_step


def run_case(ctx, spec: str, plan: Plan) -> int:
    torch.manual_seed(0)  # every rank draws the same dropout masks, as the trainer seeds them
    model, inputs = parse_model_spec(spec).builder()
    model = parallelize(model, plan, mesh=ctx.mesh)
    opt = torch.optim.AdamW(optimizer_param_groups(model), lr=1e-3, foreach=True)
    steps = training_step(model, opt, inputs, plan)
    return tracked_peak(model, opt, steps.run, steps=2 * steps.per_step, inputs=inputs).by_kind["Total"]


def worst_worker(ctx, cases: list[tuple[str, str]], out: str) -> None:
    """cases: (python: spec, plan JSON); writes [[peak of rank r] per case] from rank 0."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    peaks = []
    for spec, text in cases:
        mine = run_case(ctx, spec, Plan.from_json(text))
        gathered = [None] * ctx.world
        dist.all_gather_object(gathered, mine, group=ctx.mesh.get_group())
        peaks.append(gathered)
    if ctx.rank == 0:
        with open(out, "w") as fh:
            json.dump(peaks, fh)
