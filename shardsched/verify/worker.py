"""Verification in a fresh interpreter, for callers that hold a process group of their own
([Note: the fake world is this process's own] in `verify.engine`): a training worker that
plans on rank 0. The child rebuilds the model from its `--model` spec (as `plan` does),
verifies the plan and prints `Verified` as JSON; the parent reads it back.

    python -m shardsched.verify.worker < request.json
    request: {"model": "<--model spec>", "layers": null | "<--layers>", "position_table": null | N,
              "plan": {plan JSON}}
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from shardsched._json import from_dict, to_dict
from shardsched.core.types import Plan, Verified


class Recipe(dict):
    """{"model": spec string, "layers": --layers or None, "position_table": train's GPT table
    or None}: how a child rebuilds the model."""


def verify_elsewhere(recipe: Recipe, plan: Plan) -> Verified:
    """Run `python -m shardsched.verify.worker` on `plan`; its `Verified`, or the child's last
    error line raised as `verify.subject.Unverifiable`."""
    from shardsched.verify.subject import Unverifiable
    request = json.dumps({**recipe, "plan": to_dict(plan)})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "shardsched.verify.worker"], input=request, text=True,
                          capture_output=True, env=env, check=False)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise Unverifiable(f"the verifying process failed ({lines[-1][:200] if lines else done.returncode})")
    return from_dict(Verified, json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    import torch
    from shardsched.models.spec import parse_model_spec
    from shardsched.profile.resolve import build_model
    from shardsched.verify.subject import Subject, verifier
    torch.set_num_threads(1)
    request = json.loads(sys.stdin.read())
    plan = from_dict(Plan, request["plan"])
    spec = parse_model_spec(request["model"])

    def build(*, micro_batch: int, seq: int | None, real: bool):
        return build_model(spec, micro_batch=micro_batch, seq=seq, measure=real, layers=request.get("layers"),
                           position_table=request.get("position_table"))
    verified = verifier(Subject(None, (), build))(plan)
    sys.stdout.write(json.dumps(to_dict(verified)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
