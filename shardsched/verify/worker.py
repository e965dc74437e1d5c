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
import sys

from shardsched._json import from_dict, to_dict
from shardsched.core.types import Plan


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
