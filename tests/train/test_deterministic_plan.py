"""`shardsched train` with no arguments picks the same plan on every run: the
planner's inputs are the device preset and an analytic profile, never a timing
taken at start (two separate processes, byte-identical plan JSON but the solver's seconds)."""
import json
import subprocess
import sys

PLAN_DEFAULT = """
import json
from shardsched.cli import build_parser
from shardsched.train.args import config_from_args
from shardsched.train.planning import make_local_plan
from shardsched.train.task import build
args = build_parser("train").parse_args(["train"])  # exactly what `shardsched train` starts from
cfg = config_from_args(args)
world = args.nproc or 2  # --nproc's default (2 workers) is applied after parsing
plan = json.loads(make_local_plan(cfg, build(cfg, world=world), world=world).to_json())
plan["solver"].pop("seconds")
print(json.dumps(plan, sort_keys=True))
"""


def plan_in_new_process() -> str:
    proc = subprocess.run([sys.executable, "-c", PLAN_DEFAULT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_default_plan_is_the_same_in_two_processes():
    first, second = plan_in_new_process(), plan_in_new_process()
    assert first == second
    plan = json.loads(first)
    assert plan["world"] == 2 and len({(u["strategy"], u.get("checkpoint", False)) for u in plan["units"]}) >= 2
