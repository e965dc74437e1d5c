"""The `shardsched` command: plan, train, bench, profile, report.

Every user mistake is a `UsageError` (or an argparse error): one line on stderr
naming the problem and the accepted forms, exit status 2, no traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from shardsched._stdout import document_stdout
from shardsched.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error: make it one line
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


# (module, add-arguments function, run function, help) per subcommand; a
# subcommand's module is imported only when it runs, so `shardsched plan` does
# not pay for the trainer's imports.
COMMANDS = {
    "plan": ("shardsched.commands.plan", "add_plan_arguments", "run_plan",
             "plan strategies, units and prefetch for a model and cluster"),
    "train": ("shardsched.commands.train", "add_train_arguments", "run_train",
              "train with a plan on real workers (default: 2 CPU workers, small GPT)"),
    "tradeoff": ("shardsched.commands.tradeoff", "add_tradeoff_arguments", "run_tradeoff",
                 "step time against memory budget: the auto plan and every uniform configuration (CSV, PNG)"),
    "bench": ("shardsched.commands.bench", "add_bench_arguments", "run_bench",
              "train under each uniform strategy and a plan; compare time and memory"),
    "profile": ("shardsched.commands.profile", "add_profile_arguments", "run_profile",
                "calibrate this machine (links, compute efficiency, FSDP2 overhead) into a --cluster file"),
    "report": ("shardsched.commands.report", "add_report_arguments", "run_report",
               "a PNG of a training run: loss, step time, tokens/s, measured vs predicted memory"),
    "gossip": ("shardsched.commands.gossip", "add_gossip_arguments", "run_gossip",
               "decentralised data parallelism: simulate N workers, compare algorithms on real workers"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    from shardsched import __version__
    parser = _Parser(prog="shardsched", description="Per-layer sharding plans under a memory budget, run on FSDP2.")
    parser.add_argument("--version", action="version", version=f"shardsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module, add, run, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == command:
            mod = importlib.import_module(module)
            getattr(mod, add)(p)
            p.set_defaults(func=getattr(mod, run))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    # `--json` (a flag, not gossip compare's `--json FILE`): stdout carries the document alone.
    guard = document_stdout() if getattr(args, "json", None) is True else contextlib.nullcontext()
    try:
        with guard:
            code = int(args.func(args) or 0)
    except UsageError as e:
        sys.stderr.write(f"shardsched {args.command}: error: {e}\n")
        code = 2
    except KeyboardInterrupt:
        sys.stderr.write("shardsched: interrupted\n")
        code = 130
    if "shardsched.train.launcher" in sys.modules:  # a worker torchrun started exits here
        return sys.modules["shardsched.train.launcher"].leave(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
