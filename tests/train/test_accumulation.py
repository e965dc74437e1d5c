"""Gradient accumulation on 2 gloo workers: both modes train like the unaccumulated run.

Global batch 8 on 2 workers is 4 rows per worker; micro-batch 1 makes K=4 micro-batches
per step, each loss scaled by 1/K. With gradients reduced every micro-batch (FSDP2's
default) or only after the last (`set_requires_gradient_sync(False)`; DDP's `no_sync`
on the all-replicate plan), losses and step 0's gradients equal the unaccumulated run of
the same plan to 1e-5, the final parameters equal one process summing the same gradients
in the same order bit for bit (and the unaccumulated run's to 1e-4: [Note: accumulation
parity in fp32]); a run resumed from a checkpoint taken mid-way continues exactly.

[Note: accumulation parity in fp32]
The parameters after the 4 steps equal, bit for bit, one process that sums the same
one-row gradients (each scaled by 1/K) in the order the run's engine sums them
(`reference_in_order`). Against one unaccumulated batch they agree only to ~1.5e-4,
and no order of summation does better: the 2-worker run without accumulation is
1.61e-4 from one process on the whole batch (the `update_error` of test_parity,
blocks.0.mlp.proj.weight), accumulated "every"/"last" 1.44e-4, one process on 8 one-row
chunks 1.61e-4. The same four runs in float64 agree to 1.7e-13..2.4e-13, so the
gap is fp32 rounding of the summation order, which Adam (an update normalised
by the root of each element's own squared gradient) passes on at full size; the
error sits in one hidden unit of block 0's MLP (fc row 65, proj column 65).
`test_in_float64_the_order_does_not_matter` runs the float64 half of this.
"""
import dataclasses
import json

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shardsched.cli import main
from shardsched.core.types import Plan
from shardsched.train.task import build_model
from shardsched.train.launcher import launch
from shardsched.train.task import build, make_task
from shardsched.train.trainer import lr_at, train

from .._gloo import lag_bytes, within
from ._helpers import TINY, mixed_plan, tiny_config, uniform_plan
from .test_parity import update_error

STEPS = 4
MODES = {"none": dict(micro_batch=None, grad_sync=None), "every": dict(micro_batch=1, grad_sync="every"),
         "last": dict(micro_batch=1, grad_sync="last")}


ORDERS = {("mixed", "every"): "micro_batch_major", ("mixed", "last"): "worker_major",
          ("ddp", "every"): "ddp_rereduce", ("ddp", "last"): "worker_major"}
"""How each run sums its K x W one-row gradients (see `reference_in_order`)."""


def _add(a: dict | None, b: dict) -> dict:
    return dict(b) if a is None else {n: a[n] + b[n] for n in a}


def _combine(grads: dict, *, world: int, k: int, order: str) -> dict:
    """The step's gradient from grads[(worker, micro)] (each already scaled by 1/K), summed
    in `order`: worker_major is grad sync "last" (each worker sums its K micro-batches,
    then one reduction); micro_batch_major is FSDP2 reducing every micro-batch into the
    sharded gradient; ddp_rereduce is DDP without `no_sync`, whose every backward adds
    the local gradient to .grad (already the reduced sum so far) and all-reduces the whole."""
    total = None
    if order == "worker_major":
        for r in range(world):
            own = None
            for i in range(k):
                own = _add(own, grads[r, i])
            total = _add(total, own)
        return {n: g / world for n, g in total.items()}
    for i in range(k):
        parts = [grads[r, i] if total is None or order == "micro_batch_major" else _add(total, grads[r, i])
                 for r in range(world)]
        reduced = None
        for part in parts:
            reduced = _add(reduced, part)
        reduced = {n: g / world for n, g in reduced.items()}
        total = _add(total, reduced) if order == "micro_batch_major" and total is not None else reduced
    return total


def reference_in_order(cfg, *, world: int, k: int, order: str, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """One process, no sharding: every step's global batch as world x K one-micro-batch
    backward passes of loss/K, combined by `_combine`; the final parameters."""
    torch.set_num_threads(1)  # as the workers: thread count changes matmul summation order
    built = build(cfg, world=1)
    task, model = make_task(cfg, built, world=1), built.model.to(dtype)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    for step in range(cfg.steps):
        micro = list(zip(*(t.chunk(world * k) for t in task.train_batch(step, 0, 1))))
        grads = {}
        for j, inputs in enumerate(micro):  # rows [j*B/(WK), (j+1)*B/(WK)): worker j // K, micro j % K
            (model(*inputs) / k).backward()
            grads[divmod(j, k)] = {n: p.grad for n, p in params.items()}
            opt.zero_grad(set_to_none=True)
        for n, g in _combine(grads, world=world, k=k, order=order).items():
            params[n].grad = g
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: v.detach().clone() for n, v in model.state_dict().items()}


def first_step_grads(cfg, plan, mesh, rank: int, mode: str) -> dict[str, torch.Tensor]:
    """The summed gradient of step 0 under `mode`, whole (gathered), before any optimizer
    step: Adam is nearly blind to a gradient's scale, so a wrong 1/K shows only here."""
    from shardsched.runtime.parallelize import parallelize
    from shardsched.runtime.accum import forward_backward, resolve, split_micro_batches
    from shardsched.train.task import build, make_task
    built = build(cfg, world=mesh.size())
    task = make_task(cfg, built, world=mesh.size())
    model = parallelize(built.model, plan, mesh=mesh)
    acc = resolve(batch=cfg.batch, world=mesh.size(), **MODES[mode])
    forward_backward(model, split_micro_batches(task.train_batch(0, rank, mesh.size()), acc.steps),
                     grad_sync=acc.grad_sync)
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}


def accumulation_worker(ctx, cfg, out: str) -> None:
    torch.set_num_threads(1)
    plans = {"mixed": mixed_plan(cfg, world=ctx.world), "ddp": uniform_plan(cfg, world=ctx.world, strategy="replicate")}
    results = {"grads": {(label, mode): first_step_grads(cfg, plan, ctx.mesh, ctx.rank, mode)
                         for label, plan in plans.items() for mode in MODES}}
    for label, plan in plans.items():
        for mode, kw in MODES.items():
            run_cfg = dataclasses.replace(cfg, run_dir=f"{cfg.run_dir}/{label}-{mode}", **kw,
                                          checkpoint_every=2 if (label, mode) == ("mixed", "last") else 0)
            res = train(run_cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plan)
            full = get_model_state_dict(res.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            results[label, mode] = (list(res.losses), full, res.summary)
    # Resumed from the checkpoint at step 2 of the "last" run: steps 3-4 again.
    resumed_cfg = dataclasses.replace(cfg, run_dir=f"{cfg.run_dir}/mixed-last", **MODES["last"],
                                      resume=f"{cfg.run_dir}/mixed-last/checkpoints/step_000002")
    res = train(resumed_cfg, mesh=ctx.mesh, rank=ctx.rank, plan=plans["mixed"])
    results["resumed"] = (list(res.losses), res.start_step)
    # The trainer's own plan (auto, default budget) priced for the accumulation, and measured.
    own = dataclasses.replace(cfg, run_dir=f"{cfg.run_dir}/own", steps=1, measure_memory=True, **MODES["last"])
    results["own"] = train(own, mesh=ctx.mesh, rank=ctx.rank).summary
    if ctx.rank == 0:
        torch.save(results, out)


def test_both_modes_equal_the_unaccumulated_run(tmp_path):
    cfg = tiny_config(str(tmp_path / "runs"), steps=STEPS)
    out = tmp_path / "results.pt"
    launch(accumulation_worker, nproc=2, args=(cfg, str(out)))
    results = torch.load(out, weights_only=False)
    init = build_model(cfg).state_dict()
    threads = torch.get_num_threads()
    try:
        refs = {order: reference_in_order(cfg, world=2, k=4, order=order) for order in set(ORDERS.values())}
    finally:
        torch.set_num_threads(threads)
    for label in ("mixed", "ddp"):
        base_losses, base_params, base_summary = results[label, "none"]
        assert base_summary["accumulation"] == 1 and base_summary["micro_batch"] == 4
        for mode in ("every", "last"):
            losses, params, summary = results[label, mode]
            assert (summary["accumulation"], summary["micro_batch"], summary["grad_sync"]) == (4, 1, mode)
            assert losses == pytest.approx(base_losses, rel=1e-5), (label, mode)
            # Step 0's gradients: the same to 1e-5 (1/K applied, reduced once or K times).
            for name, want in results["grads"][label, "none"].items():
                got = results["grads"][label, mode][name]
                assert ((got - want).norm() / want.norm()).item() < 1e-5, (label, mode, name)
            for name, want in refs[ORDERS[label, mode]].items():
                # The same one-row gradients summed in the same order on one process: two
                # workers add a+b, exact in any order, so the parameters are bit-identical.
                assert torch.equal(params[name], want), (label, mode, name)
            for name, want in base_params.items():
                # Against the unaccumulated run only the summation order differs, which fp32
                # Adam cannot hide to 1e-5: see [Note: accumulation parity in fp32].
                assert update_error(name, params[name], want, init[name]) < 1e-4, (label, mode, name)
    resumed_losses, start = results["resumed"]
    assert start == 2
    assert resumed_losses == pytest.approx(results["mixed", "last"][0][2:], rel=1e-5)
    own = results["own"]
    assert (own["accumulation"], own["grad_sync"]) == (4, "last")
    # Under the budget and within 3% of the prediction, up to one collective's buffer that
    # gloo's thread may still hold: [Note: gloo's lagging buffers] in tests/_gloo.py.
    plan = Plan.from_json((tmp_path / "runs/own/plan.json").read_text())
    assert own["measured_peak_bytes"] <= own["usable_budget_bytes"] + lag_bytes(plan), own
    assert within(own["measured_peak_bytes"], own["predicted_peak_bytes"], plan, rel=0.03), own
    # The data position counts global batches, whatever the micro-batch.
    meta = json.loads((tmp_path / "runs/mixed-last/checkpoints/step_000002/meta.json").read_text())
    assert meta["data_position"] == 2 and meta["samples_seen"] == 2 * cfg.batch


def test_in_float64_the_order_does_not_matter(tmp_path):
    """[Note: accumulation parity in fp32], checked: in float64 every summation order of the
    accumulated step lands on the one-batch parameters to 1e-10 (the 1/K scaling is exact);
    in float32 the same runs differ from it by more than 1e-5."""
    cfg = tiny_config(str(tmp_path), steps=STEPS)
    threads = torch.get_num_threads()
    try:
        errors = {}
        for dtype in (torch.float64, torch.float32):
            init = {n: v.to(dtype) for n, v in build_model(cfg).state_dict().items()}
            whole = reference_in_order(cfg, world=1, k=1, order="worker_major", dtype=dtype)
            for order in set(ORDERS.values()):
                got = reference_in_order(cfg, world=2, k=4, order=order, dtype=dtype)
                errors[dtype, order] = max(update_error(n, got[n], whole[n], init[n]) for n in whole)
    finally:
        torch.set_num_threads(threads)
    for (dtype, order), err in errors.items():
        assert (err < 1e-10) if dtype is torch.float64 else (err > 1e-5), (dtype, order, err)


@pytest.mark.parametrize("argv, words", [
    (["--global-batch", "8", "--micro-batch", "3"], "--global-batch 8 is not a multiple of 2 workers x --micro-batch 3"),
    (["--global-batch", "6", "--micro-batch", "2"], "--global-batch 6 is not a multiple of 2 workers x --micro-batch 2"),
    (["--micro-batch", "0"], "--micro-batch"),
])
def test_a_batch_that_does_not_divide_is_one_line(tmp_path, capsys, argv, words):
    code = main(["train", "--model", TINY, "--seq", "16", "--steps", "1", "--nproc", "2", "--quiet",
                 "--run-dir", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_gradients_are_reduced_once_with_sync_on_the_last(monkeypatch):
    """K=3 micro-batches over 2 FSDP2 units with parameters (fake process group): 6
    ReduceScatters when reducing every micro-batch, 2 (the last micro-batch's) with grad
    sync last. Counted at
    torch's `reduce_scatter_single`, which FSDP2's default ReduceScatter calls."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsched.core.types import GradSync
    from shardsched.runtime.accum import forward_backward
    calls = []
    real = dist.reduce_scatter_single
    monkeypatch.setattr(dist, "reduce_scatter_single", lambda *a, **k: calls.append(1) or real(*a, **k))
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
        x = torch.randn(4, 8)
        counts = {}
        for sync in GradSync:
            calls.clear()
            forward_backward(model, [(x,)] * 3, grad_sync=sync, loss_of=lambda out: out.sum())
            counts[sync.value] = len(calls)
    finally:
        dist.destroy_process_group()
    assert counts == {"every": 6, "last": 2}
