"""The micro-batch and sequence a plan assumes: the model's own sequence for hf: (capped at 4096
with a note), --micro-batch/--seq honoured or refused for python: models, the 3-tuple contract,
`plan --plan` at the plan's own shape, and the console stating the shape."""
import json
import re
import subprocess
import sys

import pytest

MODULE = '''
import torch, torch.nn as nn

class Net(nn.Module):
    def __init__(self, vocab=64, width=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = torch.tanh(b(x))
        return nn.functional.cross_entropy(self.out(x).flatten(0, 1), targets.flatten())

def fixed():
    torch.manual_seed(0)
    return Net(), (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))

def with_batches():
    model, inputs = fixed()
    return model, inputs, lambda step, rank, world: inputs

def sized(micro_batch=2, seq=8):
    torch.manual_seed(0)
    return Net(), (torch.randint(0, 64, (micro_batch, seq)), torch.randint(0, 64, (micro_batch, seq)))
'''


def shardsched(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "shardsched", "plan", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture()
def user_dir(tmp_path):
    (tmp_path / "shapes.py").write_text(MODULE)
    return tmp_path


def plan_json(*args, cwd=None) -> dict:
    r = shardsched(*args, "--strategy", "full_shard", "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_python_three_tuple_plans_like_the_two_tuple(user_dir):
    two = plan_json("--model", "python:shapes:fixed", "--world", "2", cwd=user_dir)
    three = plan_json("--model", "python:shapes:with_batches", "--world", "2", cwd=user_dir)
    assert three["fingerprint"] == two["fingerprint"] and three["predicted"] == two["predicted"]
    assert (three["micro_batch"], three["seq"]) == (2, 8)


def test_python_micro_batch_and_seq_are_passed_when_declared(user_dir):
    small = plan_json("--model", "python:shapes:sized", "--world", "2", cwd=user_dir)
    big = plan_json("--model", "python:shapes:sized", "--world", "2", "--micro-batch", "8", "--seq", "32",
                    cwd=user_dir)
    assert (small["micro_batch"], small["seq"]) == (2, 8) and (big["micro_batch"], big["seq"]) == (8, 32)
    # 16x the tokens: the activations at the peak grow (the parameters do not); the peak moves
    # to a moment with less than all of them live, so not 16x
    assert big["predicted"]["memory"]["activations"] > 2 * small["predicted"]["memory"]["activations"]
    assert big["predicted"]["peak_bytes"] > small["predicted"]["peak_bytes"]
    assert big["predicted"]["model_states_bytes"] == small["predicted"]["model_states_bytes"]


@pytest.mark.parametrize("flag", ["--micro-batch", "--seq"])
def test_python_shape_flag_without_argument_is_refused(user_dir, flag):
    r = shardsched("--model", "python:shapes:fixed", "--world", "2", flag, "4", cwd=user_dir)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and f"{flag} 4: python:shapes:fixed takes no" in r.stderr


def test_replan_uses_the_plans_micro_batch_and_seq(tmp_path):
    spec = "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64"
    made = plan_json("--model", spec, "--world", "4", "--device", "cpu", "--micro-batch", "4", "--seq", "32",
                     "--out", str(tmp_path / "p.json"))
    again = plan_json("--model", spec, "--world", "4", "--device", "cpu", "--plan", str(tmp_path / "p.json"))
    assert (again["micro_batch"], again["seq"]) == (4, 32)
    assert again["predicted"]["peak_bytes"] == made["predicted"]["peak_bytes"]
    one = plan_json("--model", spec, "--world", "4", "--device", "cpu", "--plan", str(tmp_path / "p.json"),
                    "--micro-batch", "1")
    assert one["predicted"]["memory"]["activations"] < made["predicted"]["memory"]["activations"]


def test_hf_plans_at_the_models_own_sequence():
    pytest.importorskip("transformers")
    own = plan_json("--model", "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512,n_positions=256", "--world", "2")
    assert (own["micro_batch"], own["seq"]) == (1, 256) and not any("positions" in n for n in own["notes"])
    capped = plan_json("--model", "hf:llama,num_hidden_layers=1,hidden_size=32,intermediate_size=64,"
                       "num_attention_heads=2,num_key_value_heads=2,vocab_size=256,max_position_embeddings=8192",
                       "--world", "2")
    assert capped["seq"] == 4096
    assert any("sequence 4096, not the model's 8192 positions" in n for n in capped["notes"])


@pytest.mark.parametrize("fuse, units", [([], "1 unit"), (["--no-fuse"], "4 units")])
def test_console_states_the_shape(fuse, units):
    r = shardsched("--model", "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64", "--world", "4", "--device", "cpu",
                   "--micro-batch", "3", "--strategy", "full_shard", *fuse)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"micro-batch 3 x seq 64: {units} *\n", r.stdout), r.stdout
