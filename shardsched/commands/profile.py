"""`shardsched profile --nproc N --out cluster.json`: calibrate this machine.

N real workers (the `train` launcher: local processes, or the ones torchrun/SLURM
started) time collectives, compute classes, the optimizer step and FSDP2's
per-unit overhead (`profile.calibrate`); rank 0 fits them and writes a cluster
file (`cost.device.cluster_file_text`) that `plan`, `train` and `bench` take
with `--cluster`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shardsched.cost.device import DEVICES
from shardsched.errors import UsageError


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--nproc", type=int, default=2, help="local workers to time collectives between (ignored under torchrun/SLURM)")
    a("--out", default="cluster.json", help="cluster file to write (default cluster.json)")
    a("--device", default=None, help=f"preset whose peak FLOP/s and inter-node link are kept: {', '.join(DEVICES)} "
                                     "(default: this machine's)")
    a("--repeats", type=int, default=7, help="timings per measurement; the median is kept (default 7)")
    a("--json", action="store_true", help="print the fit report as JSON instead of a table")


def _check(args: argparse.Namespace) -> str:
    """Everything a user can get wrong, before any worker starts; returns the base preset."""
    from shardsched.profile.calibrate import machine_preset
    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    base = args.device or machine_preset()
    if base not in DEVICES:
        raise UsageError(f"unknown device {base!r}; accepted: {', '.join(DEVICES)}")
    parent = Path(args.out).parent
    if str(parent) not in ("", ".") and not parent.is_dir():
        raise UsageError(f"--out {args.out}: directory {parent} does not exist")
    return base


def _calibrate_worker(ctx, base: str, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from shardsched.core.types import Optimizer, Precision
    from shardsched.cost.device import cluster_file_text
    from shardsched.cost.memory import state_bytes
    from shardsched._paths import atomic_write
    from shardsched.profile import calibrate as cal
    group, device = ctx.mesh.get_group(), ctx.device
    samples = cal.time_collectives(group=group, device=device, repeats=repeats) if ctx.world > 1 else []
    compute = cal.time_compute(device=device, repeats=repeats)
    elementwise = cal.time_elementwise(device=device, repeats=repeats)
    optimizer = cal.time_optimizer(device=device, repeats=repeats)
    alone, _ = dist.new_subgroups(group_size=1)  # collective: every rank gets its own group of one
    overhead = cal.time_unit_overhead(mesh=DeviceMesh.from_group(alone, device.type), device=device,
                                      repeats=repeats)
    op_host = cal.time_op_host(device=device, repeats=repeats)
    mine = [[[s.kind.value, s.nbytes, s.seconds] for s in samples], compute, elementwise, list(optimizer),
            list(overhead), list(op_host)]
    samples_, compute, elementwise, optimizer, overhead, op_host = cal.slowest_rank(mine, group=group)
    if ctx.rank != 0:
        return
    samples = [cal.Sample(kind=cal.Collective(k), nbytes=n, seconds=t) for k, n, t in samples_]
    calib = cal.fitted_device(DEVICES[base], samples=samples, compute=compute, optimizer=tuple(optimizer),
                              elementwise=elementwise, unit_overhead=overhead[0], tensor_overhead=overhead[1],
                              world=ctx.world, op_host=cal.HostPerOp(*op_host),
                              state_bytes_at_rest=state_bytes(Precision.FP32, Optimizer.ADAM).at_rest)
    atomic_write(out, cluster_file_text(calib.device, fit=calib.fit) + "\n")


def run_profile(args: argparse.Namespace) -> int:
    from shardsched.cost.device import read_cluster_file
    from shardsched.train.launcher import WorkerFailed, launch
    from shardsched.train.args import world_size
    base = _check(args)
    world = world_size(args.nproc)
    try:
        launch(_calibrate_worker, nproc=world, args=(base, args.repeats, args.out))
    except WorkerFailed as e:
        print(f"shardsched profile: {e}", file=sys.stderr)
        return 1
    fit = json.loads(Path(args.out).read_text())["fit"]
    if args.json:
        print(json.dumps(fit, indent=1))
    else:
        print_fit(read_cluster_file(args.out), fit, out=args.out)
    return 0


def print_fit(device, fit: dict, *, out: str) -> None:
    from rich.table import Table

    from shardsched._fmt import console
    table = Table(title=f"shardsched profile: {fit['world']} workers, base {device.name} -> {out}")
    for col in ("figure", "value", "fit error (rms)"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    link = fit["link"]
    if isinstance(link, dict):
        for name, f in {"link (all collectives)": link, **fit["link_by_collective"]}.items():
            table.add_row(f"{name}: alpha / bandwidth",
                          f"{f['alpha_seconds'] * 1e6:.1f} us / {f['bandwidth'] / 1e9:.2f} GB/s",
                          f"{f['rel_error']:.1%}")
    for cls, f in fit["compute"].items():
        table.add_row(f"{cls}: efficiency of {device.peak_flops / 1e9:.0f} GFLOP/s peak", f"{f['efficiency']:.3f}",
                      f"{f['rel_error']:.1%}")
    table.add_row("elementwise operators: memory bandwidth", f"{device.memory_bandwidth / 1e9:.2f} GB/s", "")
    table.add_row("optimizer step: memory bandwidth", f"{device.optimizer_bytes_per_second / 1e9:.2f} GB/s", "")
    table.add_row("FSDP2 host time per unit", f"{device.unit_overhead_seconds * 1e3:.2f} ms", "")
    table.add_row("FSDP2 host time per parameter tensor", f"{device.tensor_overhead_seconds * 1e3:.3f} ms", "")
    table.add_row("host time per operator: plain / recomputed / +sac",
                  " / ".join(f"{v * 1e6:.1f}" for v in (device.op_host_seconds, device.recompute_op_host_seconds,
                                                       device.sac_op_host_seconds)) + " us", "")
    console().print(table)
