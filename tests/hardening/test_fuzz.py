"""Every bad input to `plan` and `train` is one line on stderr, exit 2, no
traceback, and nothing created or changed: a fixed corpus of every case named
in issue 9, then property-based fuzzing (hypothesis, fixed seed) around it.

All in-process (cli.main), so the whole file runs in well under a minute:
`train` rejects bad input in the parent, before any worker starts.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ._util import assert_rejected, run_cli, snapshot

PLAN = ["plan", "--model", "tiny", "--device", "cpu", "--world", "2"]
TRAIN = ["train", "--model", "gpt:layers=2,hidden=32,heads=2,seq=16", "--seq", "16", "--quiet"]


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory) -> dict:
    """A valid plan for PLAN (and, with world 2, for TRAIN's model: see train_plan)."""
    out = tmp_path_factory.mktemp("base") / "plan.json"
    import shardsched.cli as cli
    assert cli.main([*PLAN, "--out", str(out), "--no-fuse", "--json"]) == 0
    return json.loads(out.read_text())


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # default outputs (runs/...) would land here
    return tmp_path


def _set(path: str, value):
    """A mutation that sets a dotted path (units.0.layers) to value."""
    def apply(d):
        keys = path.split(".")
        obj = d
        for k in keys[:-1]:
            obj = obj[int(k)] if isinstance(obj, list) else obj[k]
        last = keys[-1]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value
        return d
    return apply


def _swap_units(d):
    d["units"][0], d["units"][1] = d["units"][1], d["units"][0]
    return d


def _dup_unit(d):
    d["units"].append(copy.deepcopy(d["units"][0]))
    return d


def _dup_layer(d):
    d["units"][1]["layers"] = d["units"][1]["layers"] + d["units"][0]["layers"]
    return d


def _drop(key):
    def apply(d):
        del d[key]
        return d
    return apply


RAW = {  # the file's bytes themselves
    "not UTF-8": b"\xff\xfe{\x00",
    "not JSON": b"{",
    "empty file": b"",
    "deeply nested": b"[" * 200_000,
    "not an object": b"[1, 2]",
    "NaN": None,  # filled from the base plan below
    "Infinity": None,
    "10**400": None,
}
MUTATIONS = {
    "missing units": _drop("units"),
    "missing fingerprint": _drop("fingerprint"),
    "mistyped world": _set("world", "2"),
    "mistyped units": _set("units", {"a": 1}),
    "mistyped layers": _set("units.0.layers", "embed"),
    "mistyped strategy": _set("units.0.strategy", "zero4"),
    "bool version": _set("version", True),
    "empty units": _set("units", []),
    "empty unit name": _set("units.0.name", ""),
    "empty layers": _set("units.0.layers", []),
    "unit named twice": _dup_unit,
    "layer named twice": _dup_layer,
    "layers out of order": _swap_units,
    "unknown prefetch": _set("units.0.forward_prefetch", ["nope"]),
    "negative params": _set("units.0.params", -5),
    "negative micro_batch": _set("micro_batch", -1),
    "zero micro_batch": _set("micro_batch", 0),
    "negative seq": _set("seq", -1),
    "negative world": _set("world", -2),
    "negative budget": _set("memory_budget_bytes", -1),
    "unknown layer": _set("units.0.layers", ["no.such.layer"]),
    "huge params": _set("units.0.params", 2**64),
}


def _raw_case(name: str, base: dict) -> bytes:
    text = json.dumps(base)
    if name == "NaN":
        return text.replace('"world": 2', '"world": NaN', 1).encode()
    if name == "Infinity":
        return text.replace('"step_seconds": ', '"step_seconds": Infinity, "x": ', 1).encode()
    if name == "10**400":
        return text.replace('"world": 2', '"world": 1' + "0" * 400, 1).encode()
    return RAW[name]


def _bad_plan_files(base: dict, where: Path) -> dict[str, Path]:
    files = {}
    for name in RAW:
        files[name] = where / f"raw-{len(files)}.json"
        files[name].write_bytes(_raw_case(name, base))
    for name, mutate in MUTATIONS.items():
        files[name] = where / f"mut-{len(files)}.json"
        files[name].write_text(json.dumps(mutate(copy.deepcopy(base))))
    return files


def test_every_bad_plan_file_is_rejected_by_plan_and_train(base_plan, work, capsys):
    files = _bad_plan_files(base_plan, work)
    assert len(files) == len(RAW) + len(MUTATIONS)
    for name, f in files.items():
        line = assert_rejected([*PLAN, "--plan", str(f), "--out", "out.json", "--trace", "t.json"], work, capsys)
        assert str(f) in line or "plan" in line, (name, line)
        assert_rejected([*TRAIN, "--plan", str(f), "--run-dir", "run"], work, capsys)
    assert not (work / "out.json").exists() and not (work / "run").exists()


def test_the_base_plan_is_accepted(base_plan, work, capsys):
    """The corpus is bad because of its mutations: the unmutated plan passes and writes --out."""
    (work / "p.json").write_text(json.dumps(base_plan))
    rc, _, err = run_cli([*PLAN, "--plan", "p.json", "--out", "out.json"], capsys)
    assert rc == 0, err
    assert json.loads((work / "out.json").read_text())["units"] == base_plan["units"]


USER_CODE = {
    "raise_on_import": "raise RuntimeError('boom on import')\n",
    "exit_on_import": "import sys\nsys.exit(3)\n",
    "raises": "def build():\n    raise ValueError('bad builder')\n",
    "exits": "import sys\ndef build():\n    sys.exit(0)\n",
    "wrong_shape": "def build():\n    return 1, 2, 3\n",
    "not_a_module": "def build():\n    return 'model', ()\n",
    "int_loss": ("import torch\nclass M(torch.nn.Module):\n    def __init__(s):\n        super().__init__()\n"
                 "        s.l = torch.nn.Linear(2, 2)\n    def forward(s, x):\n        return s.l(x).long()\n"
                 "def build():\n    return M(), (torch.ones(1, 2),)\n"),
    "none_loss": ("import torch\nclass M(torch.nn.Module):\n    def __init__(s):\n        super().__init__()\n"
                  "        s.l = torch.nn.Linear(2, 2)\n    def forward(s, x):\n        return None\n"
                  "def build():\n    return M(), (torch.ones(1, 2),)\n"),
    "forward_raises": ("import torch\nclass M(torch.nn.Module):\n    def __init__(s):\n        super().__init__()\n"
                       "        s.l = torch.nn.Linear(2, 2)\n    def forward(s, x):\n        return s.l(x, x)\n"
                       "def build():\n    return M(), (torch.ones(1, 2),)\n"),
}


@pytest.mark.parametrize("name", sorted(USER_CODE))
def test_python_builders_that_misbehave_are_one_line_naming_them(name, work, capsys, monkeypatch):
    mod = f"usercode_{name}"
    (work / f"{mod}.py").write_text(USER_CODE[name])
    monkeypatch.syspath_prepend(str(work))
    line = assert_rejected(["plan", "--model", f"python:{mod}:build", "--world", "2"], work, capsys)
    assert f"python:{mod}" in line or repr(mod) in line, line


def _flag_cases(work: Path) -> list[tuple[list[str], str]]:
    (work / "afile").write_text("x")
    (work / "adir").mkdir()
    plan_flags = [
        (["--memory-budget", ""], "--memory-budget is empty"), (["--plan", ""], "--plan is empty"),
        (["--strategy", ""], "--strategy is empty"), (["--out", ""], "--out is empty"),
        (["--trace", ""], "--trace is empty"), (["--model", ""], "--model is empty"),
        (["--gpus-per-node", "0"], "--gpus-per-node"), (["--seq", "0"], "--seq"),
        (["--micro-batch", "0"], "--micro-batch"), (["--world", "0"], "--world"),
        (["--world", str(2**40)], "--world"),
        (["--time-limit", "0"], "--time-limit"), (["--time-limit", "-1"], "--time-limit"),
        (["--time-limit", "nan"], "--time-limit"), (["--time-limit", "inf"], "--time-limit"),
        (["--model", "gpt:layers=100000000"], "layers=100000000"), (["--model", "gpt:hidden=99999999999"], "hidden"),
        (["--model", "gpt:layers=" + "9" * 5000], "gpt:"),
        (["--out", "adir"], "is a directory"), (["--out", "afile/x.json"], "not a directory"),
        (["--out", "missing/x.json"], "does not exist"), (["--trace", "adir"], "is a directory"),
        (["--out", "/proc/x.json"], "cannot write"), (["--out", "same.json", "--trace", "same.json"], "same file"),
    ]
    train_flags = [
        (["--memory-budget", ""], "empty"), (["--data", ""], "--data is empty"), (["--plan", ""], "empty"),
        (["--strategy", ""], "empty"), (["--run-dir", ""], "--run-dir is empty"), (["--resume", ""], "empty"),
        (["--lr", "inf"], "--lr"), (["--lr", "nan"], "--lr"), (["--lr", "0"], "--lr"), (["--lr", "-1"], "--lr"),
        (["--seed", "-1"], "--seed"), (["--seed", str(2**63)], "--seed"), (["--seq", "0"], "--seq"),
        (["--steps", "0"], "--steps"), (["--batch", "0"], "--batch"), (["--nproc", "0"], "--nproc"),
        (["--checkpoint-every", "-1"], "--checkpoint-every"), (["--eval-every", "-2"], "--eval-every"),
        (["--model", "gpt:layers=100000000"], "layers"), (["--run-dir", "afile"], "is a file"),
        (["--run-dir", "afile/sub"], "under the file"), (["--run-dir", "/proc/run"], "cannot write"),
        (["--resume", "nowhere"], "no such directory"), (["--model", "python:os:getcwd"], "must return (model, example_inputs)"),
    ]
    return [(["plan", "--device", "cpu", *a], f) for a, f in plan_flags] + \
           [([*TRAIN, *a], f) for a, f in train_flags]


def test_every_bad_flag_is_one_line(work, capsys):
    for argv, fragment in _flag_cases(work):
        assert_rejected(argv, work, capsys, fragment)


def test_resume_with_garbage_config_changes_nothing(work, capsys):
    run = work / "run"
    (run / "checkpoints").mkdir(parents=True)
    for garbage in (b"\xff", b"{", b"[]", b'{"steps": "many"}', b'{"lr": NaN}', b'{"seed": 1' + b"0" * 400 + b"}",
                    b'{"model": "python:evil:build"}'):
        (run / "config.json").write_bytes(garbage)
        assert_rejected([*TRAIN, "--resume", str(run)], work, capsys, "config.json" if b"python" not in garbage
                        else "give --model python:evil:build again")


# ------------------------------------------------------------ property-based

_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(d, prefix=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@seed(9)
@FUZZ
@given(data=st.data())
def test_fuzzed_plan_files_exit_0_or_2_cleanly(base_plan, work, capsys, data):
    """Replace any one value of a valid plan by arbitrary JSON: the command either
    accepts it (exit 0, writes --out) or rejects it by the contract."""
    plan = copy.deepcopy(base_plan)
    paths = sorted(_paths(plan), key=str)
    path = data.draw(st.sampled_from(paths))
    value = data.draw(_JSON)
    obj = plan
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    f = work / "fuzz.json"
    f.write_text(json.dumps(plan))
    (work / "out.json").unlink(missing_ok=True)
    before = snapshot(work)
    rc, _, err = run_cli([*PLAN, "--plan", str(f), "--out", "out.json"], capsys)
    assert "Traceback" not in err
    if rc == 0:
        assert (work / "out.json").exists()
    else:
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert snapshot(work) == before


@seed(9)
@FUZZ
@given(blob=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzzed_plan_bytes_are_rejected(work, capsys, blob):
    f = work / "blob.json"
    f.write_bytes(blob)
    assert_rejected([*PLAN, "--plan", str(f), "--out", "out.json"], work, capsys)


_BAD_TRAIN = st.one_of(
    st.tuples(st.just("--lr"), st.floats().filter(lambda x: not (math.isfinite(x) and 0 < x <= 1e3)).map(repr)),
    st.tuples(st.just("--seed"), st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63)).map(str)),
    st.tuples(st.sampled_from(["--steps", "--seq", "--batch", "--nproc"]), st.integers(max_value=0).map(str)),
    st.tuples(st.sampled_from(["--checkpoint-every", "--eval-every"]), st.integers(max_value=-1).map(str)),
    st.tuples(st.sampled_from(["--data", "--plan", "--strategy", "--run-dir", "--resume", "--memory-budget",
                               "--model"]), st.sampled_from(["", " ", "\t"])),
    st.tuples(st.just("--memory-budget"), st.text(max_size=8).filter(lambda s: not s.strip()[:1].isdigit())),
    st.tuples(st.just("--model"), st.text(max_size=12).filter(lambda s: not s.strip().startswith("python:"))
              .filter(lambda s: s.strip() not in ("tiny", "small") and not s.strip().startswith("gpt:"))),
)


@seed(9)
@FUZZ
@given(flag=_BAD_TRAIN)
def test_fuzzed_bad_train_flags(work, capsys, flag):
    name, value = flag
    if "\x00" in value:
        return  # argv cannot hold NUL
    assert_rejected([*TRAIN, f"{name}={value}" if value.startswith("-") else name, *([] if value.startswith("-")
                     else [value])], work, capsys)
