"""`shardsched gossip simulate | compare`."""
from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from shardsched.errors import UsageError
from shardsched.gossip.config import GossipConfig, Sync, Topology, check_config, parse_syncs

DENSE_MAX_DIM = 512
"""Up to this many parameters the simulated least squares has dense A_i; above, diagonal A_i."""


def add_gossip_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gossip_command", required=True, parser_class=type(parser))
    s = sub.add_parser("simulate", help="N virtual workers in one process: consensus, bytes, predicted time")
    s.add_argument("--workers", type=int, default=64, help="virtual workers (default 64)")
    s.add_argument("--sync", default="crossover,sgp,dpsgd,allreduce", help="algorithms, comma-separated")
    s.add_argument("--steps", type=int, default=100)
    s.add_argument("--params", type=int, default=4096, help="least-squares parameters (default 4096)")
    s.add_argument("--tensors", type=int, default=16, help="parameter tensors the model is cut into (default 16)")
    s.add_argument("--segments", type=int, default=4, help="crossover segments (default 4)")
    s.add_argument("--groups", type=int, default=0, help="crossover groups (default 0: one per worker)")
    s.add_argument("--topology", choices=[t.value for t in Topology], default="ring", help="dpsgd neighbours")
    s.add_argument("--lr", type=float, default=0.1)
    s.add_argument("--half-life", type=float, default=0.0, help="lr / (1 + step / half_life); 0: constant")
    s.add_argument("--device", default="h100", help="device preset for the predicted time (cpu, v100, a100, h100)")
    s.add_argument("--gpus-per-node", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--csv", default=None, help="write per-step consensus to this CSV")
    s.add_argument("--png", default=None, help="plot consensus distance per step to this PNG")
    c = sub.add_parser("compare", help="train every algorithm on real workers: accuracy, bytes, step time")
    from shardsched.gossip.compare import add_compare_arguments
    add_compare_arguments(c)


def _check_simulate(args: argparse.Namespace) -> tuple[Sync, ...]:
    from shardsched.cost.device import DEVICES
    syncs = parse_syncs(args.sync)
    for name in ("workers", "steps", "params", "tensors", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.tensors > args.params:
        raise UsageError(f"--tensors {args.tensors} cannot exceed --params {args.params}")
    if args.segments < 1 or args.segments > args.tensors:
        raise UsageError(f"--segments {args.segments} must be between 1 and the model's {args.tensors} parameter tensors")
    if args.device not in DEVICES:
        raise UsageError(f"--device {args.device}: accepted: {', '.join(DEVICES)}")
    if args.lr <= 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    for sync in syncs:
        check_config(GossipConfig(sync=sync, groups=args.groups if sync is Sync.CROSSOVER else 0),
                     world=args.workers)
    return syncs


def simulation_problem(*, workers: int, params: int, tensors: int, seed: int):
    """Dense least squares up to DENSE_MAX_DIM parameters (step-by-step simulator); above, the
    separable DiagonalLeastSquares, which the blocked simulator runs (docs/design.md, "Gossip")."""
    from shardsched.gossip.problems import DiagonalLeastSquares, LeastSquares
    if params <= DENSE_MAX_DIM:
        return LeastSquares.make(workers=workers, dim=params, rows=2 * params, pieces=tensors, seed=seed)
    return DiagonalLeastSquares.make(workers=workers, dim=params, pieces=tensors, seed=seed)


def _problem_while_preparing(args: argparse.Namespace, cfgs: list[GossipConfig]):
    """The simulation problem, made in a thread while this one probes every algorithm's mixing and
    computes its spectral gap (both cached for `simulate` and `report.summarize`).

    [Note: overlap] Neither needs the problem's data, and making it is one torch.randn that
    releases the GIL: 9 s for 1024 x 2^20 optima on one core (torch's generator is sequential),
    while the probes and gaps take 2 s (SGP) to 12 s (Crossover: 4 segments, 8-step period)."""
    from shardsched.gossip import report
    from shardsched.gossip.problems import DiagonalLeastSquares
    from shardsched.gossip.simulate import prepare
    with ThreadPoolExecutor(max_workers=1) as pool:
        making = pool.submit(simulation_problem, workers=args.workers, params=args.params, tensors=args.tensors,
                             seed=args.seed)
        for cfg in cfgs:
            if args.params > DENSE_MAX_DIM:
                shapes = DiagonalLeastSquares.empty(workers=args.workers, dim=args.params, pieces=args.tensors)
                prepare(shapes, cfg, steps=args.steps, segments=args.segments)
            report.mixing_gap(cfg, args.workers)
        return making.result()


def run_simulate(args: argparse.Namespace) -> int:
    from shardsched.gossip import report
    from shardsched.gossip.simulate import decaying_lr, simulate
    syncs = _check_simulate(args)
    cfgs = [GossipConfig(sync=sync, groups=args.groups if sync is Sync.CROSSOVER else 0,
                         topology=Topology(args.topology), seed=args.seed) for sync in syncs]
    problem = _problem_while_preparing(args, cfgs)
    nbytes = args.params * problem.initial().element_size()
    rows = []
    for cfg in cfgs:
        # The table, CSV and PNG need the curves only: no final models (4 GiB at 1024 x 1M).
        res = simulate(problem, cfg, steps=args.steps, lr=decaying_lr(args.lr, half_life=args.half_life),
                       segments=args.segments, models=False)
        rows.append(report.summarize(res, cfg, nbytes=nbytes, device=args.device,
                                     gpus_per_node=args.gpus_per_node, segments=args.segments))
    title = (f"gossip simulate: {args.workers} workers, {args.params:,} parameters, {args.steps} steps, "
             f"predicted on {args.device} ({args.gpus_per_node} per node)")
    report.print_table(rows, title=title)
    if args.csv:
        report.write_csv(rows, args.csv)
    if args.png:
        report.write_png(rows, args.png, title=title)
    return 0


def run_gossip(args: argparse.Namespace) -> int:
    if args.gossip_command == "simulate":
        return run_simulate(args)
    from shardsched.gossip.compare import run_compare
    return run_compare(args)
