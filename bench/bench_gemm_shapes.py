"""Matmul efficiency by shape: does a small micro-batch lose GEMM efficiency the presets do not price?

    PYTHONPATH=. python3 bench/bench_gemm_shapes.py --out gemm.json    # on a GPU (bf16), ~30 s
    .venv/bin/python bench/bench_gemm_shapes.py                        # tiny shapes on the CPU

`x[m, k] @ w[k, n]` forward and forward+backward for the linear layers of Llama-style models (1.1B,
Llama 2 7B/13B/70B, Llama 3's vocabulary) at m = 512 to 16K tokens per micro-batch, each timed as
`reps` calls back to back and one synchronize, so the host runs ahead as it does in a training
step. Efficiency is FLOPs (2mkn forward, 6mkn with backward) over the time, of the device's
peak (the `machine_preset`'s). Below ~1K tokens on a 2048-wide layer the host's ~0.1 ms per
autograd call is the time (the row measures the host, not the kernel); the planner prices that
host apart ([Note: host time per op] in plan/schedule.py). docs/design.md, "Checked on a GPU",
gives what an H200 measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from shardsched.cost.device import DEVICES
from shardsched.profile.calibrate import machine_preset

GPU_DIMS = ((2048, 2048), (2048, 256), (2048, 5632), (5632, 2048), (2048, 32000), (4096, 4096), (4096, 11008),
            (11008, 4096), (5120, 13824), (8192, 8192), (8192, 28672), (28672, 8192), (4096, 128256))
"""(k, n): TinyLlama-1.1B's projections and head, Llama 2 7B / 13B / 70B's, Llama 3's head."""
GPU_TOKENS = (512, 1024, 2048, 4096, 8192, 16384)
CPU_DIMS, CPU_TOKENS = ((64, 64), (64, 256), (256, 64)), (16, 64, 256)


def per_call(fn, *, sync, reps: int = 10, trials: int = 3) -> float:
    """Median over `trials` of (seconds of `reps` calls back to back, one sync) / reps."""
    for _ in range(3):
        fn()
    sync()
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def gemm_row(m: int, k: int, n: int, *, device: str, dtype: torch.dtype, peak: float, sync) -> dict:
    x = torch.randn(m, k, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(k, n, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(m, n, device=device, dtype=dtype)

    def fwd_bwd() -> None:
        (x @ w).backward(g)
        x.grad = w.grad = None
    fwd, both = per_call(lambda: x @ w, sync=sync), per_call(fwd_bwd, sync=sync)
    return dict(m=m, k=k, n=n, fwd_seconds=fwd, seconds=both, fwd_efficiency=2 * m * k * n / fwd / peak,
                efficiency=6 * m * k * n / both / peak)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = DEVICES[machine_preset() if cuda else "cpu"].peak_flops
    rows = []
    print(f"{'tokens':>7s} {'k':>6s} {'n':>7s} {'fwd':>6s} {'fwd+bwd':>8s}  (efficiency of {peak / 1e12:g} TFLOP/s)")
    for k, n in GPU_DIMS if cuda else CPU_DIMS:
        for m in GPU_TOKENS if cuda else CPU_TOKENS:
            r = gemm_row(m, k, n, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32, peak=peak,
                         sync=sync)
            rows.append(r)
            print(f"{m:7d} {k:6d} {n:7d} {r['fwd_efficiency']:6.3f} {r['efficiency']:8.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
