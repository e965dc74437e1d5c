"""Every `--json` prints the document and nothing else on stdout (issue 17).

Each command runs in a fresh interpreter, so a native library's first-use chatter
(HiGHS >= 1.16 prints a banner when the first `Highs` of a process is made) would
land on stdout here if it were not silenced; the plans below engage the MILP.
"""
import json
import os
import subprocess
import sys

import pytest

from shardsched._stdout import document_stdout, native_quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_TINY = "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512"


def shardsched(*args):
    return subprocess.run([sys.executable, "-m", "shardsched", *args], capture_output=True, text=True, cwd=ROOT)


def parsed(r) -> dict | list:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # the whole stdout is one document


@pytest.mark.parametrize("model, extra", [
    ("llama-7b", ["--world", "64", "--gpus-per-node", "8", "--device", "a100", "--memory-budget", "40GiB"]),
    ("gpt:layers=6,hidden=256,heads=4,vocab=2048,seq=256", ["--world", "8", "--device", "cpu",
                                                             "--memory-budget", "40MiB"]),
    ("python:examples/my_model.py:build", ["--world", "8", "--device", "cpu", "--memory-budget", "8MiB"]),
    (HF_TINY, ["--world", "8", "--device", "cpu", "--memory-budget", "64MiB"]),
], ids=["preset", "gpt", "python", "hf"])
def test_plan_json_is_the_whole_stdout_with_the_solver_engaged(model, extra, tmp_path):
    plan = parsed(shardsched("plan", "--model", model, "--strategy", "auto", *extra, "--json"))
    assert plan["solver"]["name"] in {"highs", "greedy", "uniform"} and plan["units"]
    assert plan["predicted"]["peak_bytes"] <= plan["memory_budget_bytes"]
    # `plan --plan FILE --json` re-evaluates a saved plan: the same document again.
    saved = tmp_path / "p.json"
    saved.write_text(json.dumps(plan))
    again = parsed(shardsched("plan", "--model", model, *extra, "--plan", str(saved), "--json"))
    assert again["units"] == plan["units"] and again["predicted"] == plan["predicted"]


def test_highs_banner_is_silenced_at_its_source():
    code = ("import highspy, sys; from shardsched.solve.milp import _new_highs; "
            "print('before', flush=True); _new_highs(); _new_highs(); print('after')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "before\nafter\n"


def test_document_stdout_sends_native_writes_to_stderr():
    # What any native library writes on descriptor 1 inside the guard goes to stderr;
    # Python's sys.stdout still reaches the real stdout.
    code = ("import os, sys; from shardsched._stdout import document_stdout\n"
            "with document_stdout():\n"
            "    os.write(1, b'native noise\\n'); print('{\"ok\": 1}')\n"
            "print('after')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"ok": 1}\nafter\n' and "native noise" in r.stderr


def test_native_quiet_drops_descriptor_1_and_restores_it(capfd):
    with native_quiet():
        os.write(1, b"dropped\n")
    os.write(1, b"kept\n")
    assert capfd.readouterr().out == "kept\n"
    with document_stdout():  # under capfd sys.stdout is not descriptor 1: left alone
        os.write(1, b"to stderr\n")
    out = capfd.readouterr()
    assert out.out == "" and out.err == "to stderr\n"
