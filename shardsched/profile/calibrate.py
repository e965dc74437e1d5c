"""Calibrate a DeviceSpec on the machine it runs on (`shardsched profile --out cluster.json`).

Every worker of a real process group takes part, so the figures carry what a
training step meets: the real backend (gloo on CPU, NCCL on GPUs) and workers
sharing cores and memory bandwidth. Measured, then fitted:

* links: AllGather, ReduceScatter and AllReduce over a sweep of message sizes,
  fitted to the alpha-beta ring model `cost.comm` prices them with,
      t = k (N-1) alpha + k (N-1)/N M / bw      (k = 1 for AG/RS, 2 for AR),
  by least squares on relative residuals (small messages weigh as much as large);
* compute: forward+backward of matmul-class (`x @ w`) and attention-class
  (`scaled_dot_product_attention`) ops at a few sizes, fitted as
  t = FLOPs / (peak_flops * efficiency) per class (`DeviceSpec.efficiency`);
* elementwise ops (GELU forward+backward): `DeviceSpec.memory_bandwidth`, as the traced
  profile prices the operators FlopCounterMode has no formula for (the bytes they read and write);
* the optimizer step (AdamW): `DeviceSpec.optimizer_bandwidth`, as `plan.schedule`
  prices it (every persistent byte read and written once);
* FSDP2's host time per unit (`DeviceSpec.unit_overhead_seconds`): the same
  stack of small layers as one plain module and as one `fully_shard` unit per
  layer, on a group of one worker (its collectives are copies, so the
  difference is FSDP2's own work), divided by the number of layers;
* the host's time per operator (`DeviceSpec.op_host_seconds` and the two after it): one
  small block plain, checkpointed and under `+sac`, per operator its forward dispatches.

Every timing is the median of `repeats` after one warm-up (what a step usually
meets; see typical()); each rank measures at once, and the slowest rank's
figure is kept (a step waits for its slowest worker).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from scipy.optimize import nnls

from shardsched.cost.comm import Collective
from shardsched.cost.device import DeviceSpec, Link
from shardsched.profile.analytic import causal_share

MESSAGE_BYTES = tuple(4 ** k * 1024 for k in range(1, 8))
"""The sweep: 4 KiB to 16 MiB, unsharded message bytes."""
MATMULS = ((512, 128, 384), (512, 128, 512), (512, 512, 128), (1024, 256, 256), (2048, 128, 256))
"""(m, k, n) of `x[m,k] @ w[k,n]`: the shapes of small transformer layers."""
ATTENTIONS = ((4, 4, 128, 32), (2, 4, 256, 32), (4, 8, 128, 16))
"""(batch, heads, seq, head_dim) of causal scaled_dot_product_attention."""
ELEMENTWISE = (1 << 16, 1 << 18, 1 << 20)
"""Elements of the GELU that `time_elementwise` times."""
CUDA_MATMULS = ((4096, 4096, 4096), (8192, 4096, 4096), (4096, 4096, 11008), (8192, 8192, 8192))
"""The same on a GPU: a 1-8B model's layers at 4-8K tokens. The small shapes above are
launch-bound there: on an H200 they fitted a matmul efficiency of 0.002 where an 8192^3
matmul reaches 0.777 of peak (docs/design.md, "Checked on a GPU")."""
CUDA_ATTENTIONS = ((2, 32, 2048, 128), (1, 32, 4096, 128), (4, 16, 2048, 64))
CUDA_ELEMENTWISE = (1 << 25, 1 << 26, 1 << 27, 1 << 28)
"""Large enough that the kernels, not autograd's ~0.1 ms per call, take the time (an H200's
GELU forward and backward: 0.16 ms at 2^24 bf16 elements, 0.23 ms at 2^26)."""
CUDA_OPTIMIZER_PARAMS = 1 << 27
"""AdamW parameters timed on a GPU (128M: 2 GiB of fp32 state; 1M there fitted 77 GB/s on an
H200, 256M 1391 GB/s)."""
OP_HOST_WARMUP, OP_HOST_REPEATS = 5, 21
"""Calls before and in the timing of `time_op_host`: selective checkpointing's first calls in
a process take ~1 s (its dispatch modes warm up) and the next few are erratic (2.5-110 ms
for one small block here)."""
OVERHEAD_LAYERS = 8
"""Layers (one unit each) of the model that measures FSDP2's per-unit host time."""


class LinkFit(NamedTuple):
    """alpha and bandwidth of one link, and how far the fit is from the timings."""

    alpha_seconds: float
    bandwidth: float
    rel_error: float
    """Root mean square of (fitted - measured) / measured over the sweep."""


class ClassFit(NamedTuple):
    """One op class: fraction of peak FLOP/s, and the fit's relative error."""

    efficiency: float
    rel_error: float


class Sample(NamedTuple):
    """One timed collective: kind, unsharded message bytes, seconds."""

    kind: Collective
    nbytes: int
    seconds: float


# ---------------------------------------------------------------- fits (pure)

def ring_coefficients(kind: Collective, nbytes: float, world: int) -> tuple[float, float]:
    """(coefficient of alpha, coefficient of 1/bandwidth) in `cost.comm`'s ring time."""
    passes = 2 if kind is Collective.ALL_REDUCE else 1
    return passes * (world - 1), passes * (world - 1) / world * nbytes


def fit_link(samples: Sequence[Sample], *, world: int) -> LinkFit:
    """Least squares alpha >= 0, 1/bw >= 0 for t = a(kind) alpha + b(kind, M) / bw, each
    row divided by its measured time (relative residuals). Exact on exact timings."""
    if world < 2 or not samples:
        raise ValueError("fitting a link needs timings of at least 2 workers")
    rows = np.array([ring_coefficients(s.kind, s.nbytes, world) for s in samples], dtype=float)
    t = np.array([s.seconds for s in samples], dtype=float)
    (alpha, inv_bw), _ = nnls(rows / t[:, None], np.ones_like(t))
    fitted = rows @ np.array([alpha, inv_bw])
    # Noisy timings on a loaded machine can fit no per-byte cost at all (inv_bw = 0); a cluster
    # file holds finite numbers only, so such a link is written as 1 PB/s: bytes cost nothing.
    bandwidth = 1.0 / inv_bw if inv_bw > 1e-15 else 1e15
    return LinkFit(alpha_seconds=float(alpha), bandwidth=float(bandwidth), rel_error=_rms((fitted - t) / t))


def fit_efficiency(flops: Sequence[float], seconds: Sequence[float], *, peak_flops: float) -> ClassFit:
    """t = F / (peak * eff): the x = 1/(peak * eff) minimising sum(((F x - t) / t)^2),
    x = sum(F/t) / sum((F/t)^2) in closed form."""
    r = np.asarray(flops, dtype=float) / np.asarray(seconds, dtype=float)
    x = r.sum() / (r * r).sum()
    return ClassFit(efficiency=float(1.0 / (x * peak_flops)), rel_error=_rms(r * x - 1.0))


def _rms(v: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(v)))) if len(v) else 0.0


# ---------------------------------------------------------------- timing

def typical(fn: Callable[[], None], *, repeats: int, sync: Callable[[], None] = lambda: None,
            before: Callable[[], None] | None = None) -> float:
    """Median seconds of `repeats` calls, after one warm-up call; `before`
    (default `sync`) runs untimed ahead of each call.

    [Note: the median, not the fastest] What a plan predicts is compared with a
    run's median step (`shardsched bench`), and a step meets what the machine
    usually gives: the other worker on the same cores, the backend's threads,
    neighbours on a shared host. The fastest call of a few is what the machine
    gives rarely; on this project's 2-core machines it priced steps 25-40% short."""
    before = before or sync
    fn()
    times = []
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def machine_preset() -> str:
    """The DEVICES preset closest to this machine's accelerator ("cpu" without one)."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    # "h200" first: an H200 ("NVIDIA H200") has its own preset (141 GB, HBM3e bandwidth).
    return next((k for k in ("h200", "h100", "a100", "v100") if k in name), "a100")


def _syncer(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _collective_fn(kind: Collective, nbytes: int, *, group, device: torch.device) -> tuple[Callable[[], None], int]:
    """The collective on an unsharded message of about `nbytes`, and its exact bytes."""
    world = dist.get_world_size(group)
    shard = torch.ones(max(1, nbytes // 4 // world), dtype=torch.float32, device=device)
    full = torch.ones(shard.numel() * world, dtype=torch.float32, device=device)
    if kind is Collective.ALL_GATHER:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn = lambda: gather(full, shard, group=group)  # noqa: E731
    elif kind is Collective.REDUCE_SCATTER:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn = lambda: scatter(shard, full, group=group)  # noqa: E731
    else:
        fn = lambda: dist.all_reduce(full, group=group)  # noqa: E731
    return fn, full.nbytes


def time_collectives(*, group, device: torch.device, sizes: Sequence[int] = MESSAGE_BYTES,
                     repeats: int = 5) -> list[Sample]:
    """Every collective at every size; all ranks start each timing together (a
    barrier, then the clock), so a rank's time is the collective's, not its wait."""
    sync, out = _syncer(device), []

    def together() -> None:
        sync()
        dist.barrier(group=group)
    for kind in Collective:
        for nbytes in sizes:
            fn, exact = _collective_fn(kind, nbytes, group=group, device=device)
            out.append(Sample(kind=kind, nbytes=exact, seconds=typical(fn, repeats=repeats, sync=sync,
                                                                       before=together)))
    return out


def _fwd_bwd(make_out: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        out = make_out()
        out.backward(torch.ones_like(out))
    return run


def shapes(device: torch.device) -> tuple[tuple, tuple, tuple]:
    """(matmuls, attentions, elementwise sizes) timed on `device`: a GPU's are large enough
    that kernels, not launches, are timed."""
    if device.type == "cuda":
        return CUDA_MATMULS, CUDA_ATTENTIONS, CUDA_ELEMENTWISE
    return MATMULS, ATTENTIONS, ELEMENTWISE


def calibration_dtype(device: torch.device) -> torch.dtype:
    """What compute is timed in: bf16 on a GPU (the presets' peak is bf16's, and mixed
    precision computes in it), fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def time_compute(*, device: torch.device, dtype: torch.dtype | None = None,
                 repeats: int = 5) -> dict[str, list[tuple[float, float]]]:
    """{op class: [(FLOPs, seconds)]} for forward+backward of each timed op (`shapes`, in
    `calibration_dtype` unless given).

    FLOPs as the profiles count them: 2mkn per matmul forward, 4 b s^2 (h d) per
    attention forward over the triangle a causal kernel computes (`analytic.causal_share`,
    as the traced and analytic profiles count it); backward twice forward for a matmul and
    2.5x for attention (FlopCounterMode's)."""
    sync, out = _syncer(device), {"matmul": [], "attention": []}
    dtype = dtype or calibration_dtype(device)
    matmuls, attentions, elementwise = shapes(device)
    rand = lambda *shape: torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)  # noqa: E731
    for m, k, n in matmuls:
        x, w = rand(m, k), rand(k, n)
        out["matmul"].append((3 * 2 * m * k * n, typical(_fwd_bwd(lambda: x @ w), repeats=repeats, sync=sync)))
    for b, h, s, d in attentions:
        q, kk, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
        fn = _fwd_bwd(lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True))
        flops = 3.5 * 4 * b * s * s * h * d * causal_share(s, s, True)
        out["attention"].append((flops, typical(fn, repeats=repeats, sync=sync)))
    return out


def time_elementwise(*, device: torch.device, dtype: torch.dtype | None = None,
                     repeats: int = 5) -> list[tuple[int, float]]:
    """[(bytes, seconds)] of GELU's forward and backward at each of `shapes`' elementwise sizes,
    bytes as the traced profile counts them for an operator with no FLOP formula (what it reads
    and writes: x -> y forward, (dy, x) -> dx backward, five tensors of the input's size)."""
    sync, dtype = _syncer(device), dtype or calibration_dtype(device)
    out = []
    for numel in shapes(device)[2]:
        x = torch.randn(numel, device=device, dtype=dtype, requires_grad=True)
        dy = torch.ones_like(x)

        def run() -> None:
            F.gelu(x).backward(dy)
            x.grad = None
        out.append((5 * numel * x.element_size(), typical(run, repeats=repeats, sync=sync)))
    return out


def fit_bandwidth(samples: Sequence[tuple[int, float]], *, fixed: bool = False) -> float:
    """Bytes/s of t = bytes / bandwidth (+ a fixed cost per call where `fixed`), least squares
    on relative residuals (each size weighs the same). `fixed` where the host's time per
    operator is priced on its own (a GPU: `DeviceSpec.op_host_seconds`): the fixed cost of a
    call is that host time, and only the slope is the device's; on a CPU both are the device's."""
    b = np.array([n for n, _ in samples], dtype=float)
    t = np.array([s for _, s in samples], dtype=float)
    rows = np.stack([np.ones_like(b), b], axis=1) if fixed else b[:, None]
    coef, _ = nnls(rows / t[:, None], np.ones_like(t))
    largest = int(np.argmax(b))  # no per-byte cost fitted (noise): the largest call's rate
    return 1.0 / coef[-1] if coef[-1] > 1e-30 else float(b[largest] / t[largest])


def time_optimizer(*, device: torch.device, params: int | None = None, tensors: int = 32,
                   repeats: int = 5) -> tuple[int, float]:
    """(parameters, seconds) of one AdamW step over `tensors` fp32 tensors (default 1M
    parameters, `CUDA_OPTIMIZER_PARAMS` on a GPU)."""
    params = params or (CUDA_OPTIMIZER_PARAMS if device.type == "cuda" else 1 << 20)
    ps = [torch.zeros(params // tensors, device=device, requires_grad=True) for _ in range(tensors)]
    for p in ps:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-3)
    return params // tensors * tensors, typical(opt.step, repeats=repeats, sync=_syncer(device))


class HostOverhead(NamedTuple):
    """FSDP2's host seconds per step beyond the plain model's."""

    per_unit: float
    per_tensor: float


def time_unit_overhead(*, mesh, device: torch.device, layers: int = OVERHEAD_LAYERS, width: int = 64,
                       repeats: int = 5) -> HostOverhead:
    """FSDP2's host seconds per step, on `mesh` (a mesh of one worker, so collectives
    are local copies): per parameter tensor from the optimizer step alone (DTensor
    dispatch, sharded - plain, / tensors), per unit from the whole step (one unit per
    layer - plain - the tensors' share, / layers)."""
    from torch.distributed.fsdp import fully_shard

    def stack() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    sync = _syncer(device)
    plain = _step_and_optimizer(stack(), width=width, device=device, repeats=repeats, sync=sync)
    sharded = stack()
    for layer in sharded:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    fsdp = _step_and_optimizer(sharded, width=width, device=device, repeats=repeats, sync=sync)
    tensors = 2 * layers  # weight and bias
    per_tensor = max(0.0, (fsdp[1] - plain[1]) / tensors)
    return HostOverhead(per_unit=max(0.0, (fsdp[0] - plain[0] - tensors * per_tensor) / layers),
                        per_tensor=per_tensor)


def _step_and_optimizer(model: torch.nn.Module, *, width: int, device: torch.device, repeats: int,
                        sync: Callable[[], None]) -> tuple[float, float]:
    """(seconds of a whole step, seconds of its optimizer step alone)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(width, width, device=device)

    def backward() -> None:
        model(x).sum().backward()

    def step() -> None:
        backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    whole = typical(step, repeats=repeats, sync=sync)
    # The optimizer alone, on gradients a backward left (zero_grad keeps them: set_to_none=False).
    backward()
    alone = typical(opt.step, repeats=repeats, sync=sync)
    opt.zero_grad(set_to_none=True)
    return whole, alone


class HostPerOp(NamedTuple):
    """Host seconds per forward operator of a layer (`DeviceSpec.op_host_seconds` and the two
    after it; [Note: host time per op] in plan/schedule.py)."""

    plain: float
    recompute: float
    selective: float


def time_op_host(*, device: torch.device, repeats: int = 5) -> HostPerOp:
    """A small Llama-style block (the project's GPT block: RMSNorm, SwiGLU) at 16 tokens, where
    its kernels take no time, forward and backward plain, checkpointed and under `+sac`, per
    forward operator it dispatches. On a CPU the host is the device and the fitted efficiencies
    price the plain and recomputed operators already: only selective checkpointing's own
    dispatch is kept."""
    from torch.utils.checkpoint import checkpoint
    from torch.utils._python_dispatch import TorchDispatchMode

    from shardsched.models.gpt import Block
    from shardsched.models.gpt_config import GPTConfig
    from shardsched.core.sac_policy import selective_contexts

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    block = Block(GPTConfig(hidden=64, heads=4, norm="rmsnorm", mlp="swiglu", bias=False)).to(device)
    x = torch.randn(1, 16, 64, device=device, requires_grad=True)
    with Count():
        block(x)
    runs = {"plain": lambda: block(x), "ckpt": lambda: checkpoint(block, x, use_reentrant=False),
            "sac": lambda: checkpoint(block, x, use_reentrant=False, context_fn=selective_contexts)}
    t = {}
    for k, f in runs.items():
        step = lambda f=f: f().sum().backward()  # noqa: E731
        for _ in range(OP_HOST_WARMUP):
            step()
        t[k] = typical(step, repeats=max(repeats, OP_HOST_REPEATS), sync=_syncer(device)) / Count.ops
    selective = max(0.0, t["sac"] - t["ckpt"])
    if device.type != "cuda":
        return HostPerOp(plain=0.0, recompute=0.0, selective=selective)
    return HostPerOp(plain=t["plain"], recompute=max(0.0, t["ckpt"] - t["plain"]), selective=selective)


# ---------------------------------------------------------------- the whole calibration

class Calibration(NamedTuple):
    """What `calibrate` found: the fitted device and the quality of each fit."""

    device: DeviceSpec
    fit: dict


def fitted_device(base: DeviceSpec, *, samples: Sequence[Sample], compute: dict, optimizer: tuple[int, float],
                  elementwise: Sequence[tuple[int, float]], unit_overhead: float, world: int,
                  state_bytes_at_rest: int, tensor_overhead: float = 0.0,
                  op_host: HostPerOp | None = None) -> Calibration:
    """`base` with every measured figure replaced (the inter-node link stays the
    base's: one node cannot measure it). Pure: the numbers in, the spec out."""
    fits = {c: fit_efficiency([f for f, _ in v], [t for _, t in v], peak_flops=base.peak_flops)
            for c, v in compute.items()}
    params, seconds = optimizer
    changes = dict(efficiency={c: f.efficiency for c, f in fits.items()}, mfu=fits["matmul"].efficiency,
                   memory_bandwidth=fit_bandwidth(elementwise, fixed=op_host is not None and op_host.plain > 0),
                   optimizer_bandwidth=2 * state_bytes_at_rest * params / seconds,
                   unit_overhead_seconds=unit_overhead, tensor_overhead_seconds=tensor_overhead)
    if op_host is not None:
        changes.update(op_host_seconds=op_host.plain, recompute_op_host_seconds=op_host.recompute,
                       sac_op_host_seconds=op_host.selective)
    report = {"compute": {c: f._asdict() for c, f in fits.items()}, "world": world,
              "elementwise": [[b, t] for b, t in elementwise],
              "optimizer": {"params": params, "seconds": seconds}, "unit_overhead_seconds": unit_overhead,
              "tensor_overhead_seconds": tensor_overhead, "op_host_seconds": op_host._asdict() if op_host else None,
              "inter": "the base preset's (not measured: one node)"}
    if world > 1:
        link = fit_link(samples, world=world)
        changes["intra"] = Link(alpha_seconds=link.alpha_seconds, bandwidth=link.bandwidth)
        report["link"] = link._asdict()
        by_kind = {k.value: fit_link([s for s in samples if s.kind is k], world=world) for k in Collective
                   if any(s.kind is k for s in samples)}
        changes["collectives"] = {k: Link(alpha_seconds=f.alpha_seconds, bandwidth=f.bandwidth)
                                  for k, f in by_kind.items()}
        report["link_by_collective"] = {k: f._asdict() for k, f in by_kind.items()}
        report["samples"] = [[s.kind.value, s.nbytes, s.seconds] for s in samples]
    else:
        report["link"] = "the base preset's (one worker: no collective to time)"
    return Calibration(device=dataclasses.replace(base, **changes), fit=report)


def slowest_rank(value, *, group):
    """The elementwise max over ranks of `value` (nested lists and dicts of numbers;
    strings must agree): a step waits for its slowest worker."""
    values: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return _max_tree(values)


def _max_tree(values: list):
    first = values[0]
    if isinstance(first, (list, tuple)):
        return [_max_tree([v[i] for v in values]) for i in range(len(first))]
    if isinstance(first, dict):
        return {k: _max_tree([v[k] for v in values]) for k in first}
    return max(values)
