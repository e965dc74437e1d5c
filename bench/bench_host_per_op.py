"""The host's time per operator of one Hugging Face Llama layer: the figures behind
`cost.device.GPU_HOST` ([Note: host time per op] in plan/schedule.py).

    PYTHONPATH=. python3 bench/bench_host_per_op.py            # on a GPU (bf16), ~40 s
    PYTHONPATH=. python3 bench/bench_host_per_op.py --device cpu

One `LlamaDecoderLayer` forward and backward, plain, checkpointed, under `+sac` and `+sac-all`,
at a few widths and token counts: the median wall time and the host time (until `backward()`
returns, before synchronising). Where the kernels take no time (256 tokens) wall = host, and
host / forward operators are the per-operator figures the GPU presets carry; at 8K tokens and
width 4096 the kernels are the slower and the host hides behind them.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

from shardsched.core.sac_policy import selective_contexts
from shardsched.core.types import Checkpoint

MODES = ("plain", "ckpt", "sac", "sac-all")
GPU_SHAPES = ((2048, 1, 256), (2048, 1, 2048), (2048, 2, 4096), (2048, 4, 2048), (4096, 2, 4096), (4096, 1, 8192))
CPU_SHAPES = ((64, 1, 16), (256, 2, 128))
"""(hidden, micro-batch, tokens per row)."""


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def layer_step(hidden: int, batch: int, seq: int, device: str):
    """(step(mode), forward operators) of one Llama layer at this shape."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 512), max_position_embeddings=16384,
                      attn_implementation="sdpa")
    layer = LlamaDecoderLayer(cfg, 0).to(device, dtype)
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype, requires_grad=True)
    pos = torch.arange(seq, device=device)[None]
    rope = tuple(t.to(dtype) for t in LlamaRotaryEmbedding(cfg).to(device)(x, pos))

    def forward(x):
        out = layer(x, position_embeddings=rope, position_ids=pos)
        return out[0] if isinstance(out, tuple) else out

    def step(mode: str) -> None:
        if mode == "plain":
            y = forward(x)
        elif mode == "ckpt":
            y = checkpoint(forward, x, use_reentrant=False)
        else:
            policy = Checkpoint.SELECTIVE if mode == "sac" else Checkpoint.SELECTIVE_ALL
            y = checkpoint(forward, x, use_reentrant=False, context_fn=lambda: selective_contexts(policy))
        y.sum().backward()
    count = _Count()
    with count:
        forward(x)
    return step, count.ops


def timed(step, mode: str, *, device: str, repeats: int) -> tuple[float, float]:
    """(median wall ms, median host ms) after a few warm-up steps (SAC's first calls are slow)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(5):
        step(mode)
    sync()
    walls, hosts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(mode)
        t1 = time.perf_counter()
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
        hosts.append((t1 - t0) * 1e3)
    return statistics.median(walls), statistics.median(hosts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    for hidden, batch, seq in GPU_SHAPES if args.device == "cuda" else CPU_SHAPES:
        step, ops = layer_step(hidden, batch, seq, args.device)
        got = {m: timed(step, m, device=args.device, repeats=args.repeats) for m in MODES}
        print(f"hidden {hidden} {batch} x {seq}, {ops} forward ops: " + "  ".join(
            f"{m} wall {w:.2f} host {h:.2f} ms" for m, (w, h) in got.items()), flush=True)
        plain, ckpt, sac = (got[m][1] for m in ("plain", "ckpt", "sac"))
        print(f"  per forward op (us): plain {plain / ops * 1e3:.1f}, recomputed {(ckpt - plain) / ops * 1e3:.1f}, "
              f"+sac {(sac - ckpt) / ops * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
