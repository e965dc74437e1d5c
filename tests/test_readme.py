"""Every command in README.md's fenced blocks runs as written, in order, from a fresh
directory that holds only what a clone has (`.venv`, `examples/`). Commands that share no
`runs/...` path run in separate groups (each in README order, in its own directory), so that
`pytest -n 2` runs them side by side.

Only sizes are changed, to keep CI time sane: `--steps N` becomes max(2, N // 100),
`--checkpoint-every N` becomes max(1, N // 100) (so the resume chain keeps its shape:
checkpoints at 1, 2, 3, resumes to 4 and 5), a `train` without `--steps` gets
`--steps 2`, and a sweep `--budgets A:B:N` gets 3 budgets (each is planned and verified: a 7B
model's twelve took 175 CPU s of the suite). Worlds of 4 become 2 (`--nproc 4`, and `--world 4` of the plan the chain
resumes under), since 4 workers on CI's 2 cores only add start-up time. `make train` / `make test` are not run here: `make test` is this suite, and
`make train` is `shardsched train`, which the list runs.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Command lines of the fenced blocks (continuations joined, comments dropped): every
    line that starts with `.venv/bin/` or `mkdir ` (the other lines are `make ...` and the layout)."""
    blocks = re.findall(r"^```\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = [shlex.split(ln, comments=True) for ln in lines if ln.startswith((".venv/bin/", "mkdir "))]
    return [shlex.join(c) if ">" not in c else _with_redirect(c) for c in commands]


def _with_redirect(words: list[str]) -> str:
    i = words.index(">")
    return f"{shlex.join(words[:i])} > {shlex.quote(words[i + 1])}"


def fewer_steps(command: str) -> str:
    command = re.sub(r"--steps (\d+)", lambda m: f"--steps {max(2, int(m.group(1)) // 100)}", command)
    command = re.sub(r"--checkpoint-every (\d+)", lambda m: f"--checkpoint-every {max(1, int(m.group(1)) // 100)}",
                     command)
    command = command.replace("--nproc 4", "--nproc 2").replace("--device cpu --world 4 --micro-batch 2",
                                                                "--device cpu --world 2 --micro-batch 2")
    command = re.sub(r"--budgets (\S+):(\S+):(\d+)", lambda m: f"--budgets {m.group(1)}:{m.group(2)}:{min(3, int(m.group(3)))}",
                     command)
    if re.search(r"\btrain\b", command) and "--steps" not in command:
        command += " --steps 2"
    return command


def test_readme_lists_commands():
    commands = readme_commands()
    assert any(c.startswith(".venv/bin/shardsched train --resume") for c in commands)
    assert commands[0] == "mkdir -p runs"  # every file the commands write goes under runs/ (git ignores it)
    for c in commands:
        for flag in ("--out", "--trace", "--png", "--csv", ">"):
            path = re.search(rf"(?:^| ){re.escape(flag)} (\S+)", c)
            assert path is None or path.group(1).startswith("runs/"), c
    assert fewer_steps(".venv/bin/shardsched train") == ".venv/bin/shardsched train --steps 2"
    assert fewer_steps("tradeoff --budgets 16GiB:80GiB:12 --csv runs/t.csv") == \
        "tradeoff --budgets 16GiB:80GiB:3 --csv runs/t.csv"


GROUPS = 4


def command_groups(commands: list[str], k: int = GROUPS) -> list[list[str]]:
    """The commands in k groups that can run apart, each in README order: commands that name
    the same `runs/...` path (a run a later one resumes, a plan a later one reads) share a
    group, so `pytest -n` can run the groups side by side."""
    paths = [set(re.findall(r"runs/[\w.-]+", c)) for c in commands]
    owner = list(range(len(commands)))  # union-find over commands that share a path

    def find(i: int) -> int:
        while owner[i] != i:
            i = owner[i]
        return i

    for i in range(len(commands)):
        for j in range(i):
            if paths[i] & paths[j]:
                owner[find(i)] = find(j)
    chains: dict[int, list[int]] = {}
    for i in range(len(commands)):
        chains.setdefault(find(i), []).append(i)
    groups: list[list[int]] = [[] for _ in range(k)]
    for chain in sorted(chains.values(), key=len, reverse=True):  # longest first, to the emptiest
        min(groups, key=len).extend(chain)
    return [[commands[i] for i in sorted(g)] for g in groups]


def test_groups_keep_every_command_once_and_chains_whole():
    commands = [c for c in readme_commands() if not c.startswith("mkdir ")]
    groups = command_groups(commands)
    assert sorted(c for g in groups for c in g) == sorted(commands)
    chain = next(g for g in groups if any("runs/fs4" in c for c in g))
    assert all(c in chain for c in commands if "runs/fs4" in c or "runs/plan.json" in c)


@pytest.mark.parametrize("group", range(GROUPS))
def test_every_readme_command_runs_as_written(tmp_path, group):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "shardsched").exists():
        pytest.fail(f"run the suite with the project's venv python (no shardsched in {venv}/bin)")
    (tmp_path / ".venv").symlink_to(venv)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = [c for c in readme_commands() if not c.startswith("mkdir ")]
    mine = command_groups(commands)[group]
    for command in map(fewer_steps, ["mkdir -p runs", *mine]):
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    if not any("runs/fs4" in c for c in mine):
        return
    # The resume chain: 3 steps with full_shard, resumed to 4 with the same plan, then to 5 under plan.json.
    rows = (tmp_path / "runs" / "fs4" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 5
    assert (tmp_path / "runs" / "fs4" / "report.png").stat().st_size > 10_000
    assert (tmp_path / "runs" / "fs4" / "plan.before-step_000004.json").exists()  # full_shard, kept aside


def test_make_train_says_what_its_time_depends_on():
    """Issue 29: "~1 min" took 3:23 on a busy machine. The README states the step count the
    default run has and what its time depends on, not a bare duration."""
    from shardsched.train.args import DEFAULT_STEPS
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("make train"))
    assert f"{DEFAULT_STEPS} steps" in line and "~1 min" not in line
    said = readme[readme.index("How long `make train` takes"):]
    for words in ("the install", "start-up", "load average", "--steps N"):
        assert words in said.split("\n\n")[0], words
