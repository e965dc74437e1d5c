"""The plan table at 80 columns: unit names break only after a "." (never mid-word),
the root unit is "(root)", and the names read back whole."""
import json
import subprocess
import sys

import pytest

from shardsched.plan.report import wrap_name


def test_wrap_name_breaks_after_dots_only():
    assert wrap_name("transformer.h.0.ln_1", 15) == "transformer.h.\n0.ln_1"
    assert wrap_name("model.embed_tokens..layers.0", 20) == "model.embed_tokens..\nlayers.0"
    assert wrap_name("blocks.1-95", 20) == "blocks.1-95"
    assert wrap_name("averyveryverylongname.x", 8) == "averyveryverylongname.\nx"  # one part: left to fold


def _plan(*args):
    r = subprocess.run([sys.executable, "-m", "shardsched", "plan", *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("strategy", ["full_shard", "replicate,transformer.h.0=full_shard"])
def test_unit_names_read_back_whole(strategy):
    pytest.importorskip("transformers")
    args = ["--model", "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512", "--world", "2", "--device", "cpu",
            "--seq", "32", "--no-fuse", "--strategy", strategy]
    names = [u["name"] or "(root)" for u in json.loads(_plan(*args, "--json"))["units"]]
    table = _plan(*args).splitlines()
    assert max(len(line) for line in table) <= 80
    start = next(i for i, line in enumerate(table) if line.lstrip().startswith("─")) + 1
    width = table[start - 2].index("strategy")  # the unit column ends where the strategy header starts
    cells: list[str] = []
    for line in table[start:]:
        if not line.strip():
            break
        cell, rest = line[:width].strip(), line[width:].strip()
        if rest and not rest.startswith(("-", "+")):  # a new row (its strategy cell is filled)
            cells.append(cell)
        else:  # the unit name continues
            cells[-1] += cell
    assert cells == names


def test_root_reads_root_in_notes_and_errors():
    from shardsched._fmt import readable_note
    assert readable_note(": shard_grad_op (fits)") == "(root): shard_grad_op (fits)"
    assert readable_note("..transformer.ln_f: replicate") == "(root)..transformer.ln_f: replicate"
    assert readable_note("blocks.0: full_shard") == "blocks.0: full_shard"
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, "-m", "shardsched", "plan", "--model", "hf:gpt2,n_layer=2,n_embd=64,n_head=2",
                        "--world", "2", "--strategy", "full_shard,nope=replicate"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "(layers: (root), transformer.wpe, transformer.h.0, " in r.stderr, r.stderr
