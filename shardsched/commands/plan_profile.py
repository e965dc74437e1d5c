"""The profile `plan` (and its `--global-batch` / `--max-batch` forms) plans from: the model
spec sized by the user's --micro-batch / --seq, profiled as `profile.resolve.profiled` does."""
from __future__ import annotations

import argparse
import dataclasses
import functools

from shardsched.core.types import Precision
from shardsched.cost.device import Cluster
from shardsched.errors import UsageError
from shardsched.profile.resolve import profiled


def sized_spec(spec, *, micro_batch: int | None, seq: int | None):
    """A `python:` spec whose builder gets the --micro-batch / --seq the user gave (or
    refuses them in one line: `models.spec.shape_kwargs`); other specs as they are."""
    if not spec.name.startswith("python:") or (micro_batch is None and seq is None):
        return spec
    return dataclasses.replace(spec, builder=functools.partial(spec.builder, micro_batch=micro_batch, seq=seq))


def profile_or_refuse(spec, micro_batch: int, seq: int | None, args: argparse.Namespace, cluster: Cluster,
                      precision: Precision):
    """`profile.resolve.profiled` (the profile and the model it was taken from), with a model
    that fails when run for real (`--measure`) one line, not a traceback: the model's own code
    raised, so the line names what it raised and the way out."""
    try:
        return profiled(spec, micro_batch=micro_batch, seq=seq, device=cluster.device,
                        precision=precision, measure=args.measure, layers=args.layers)
    except (UsageError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - the model's forward/backward under the measuring hooks
        if not args.measure:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"--measure: running {spec.name} on this machine raised {type(e).__name__}: {msg[:200]}; "
                         f"accepted: leave out --measure (traced on fake tensors), or another --micro-batch/--seq"
                         ) from None
