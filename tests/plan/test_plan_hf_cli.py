"""`shardsched plan` on hf:/python: models: same command, same plan; device-memory warning;
tied sets refused in an edited plan; bad hf: input is one line and exit 2."""
import json
import re
import subprocess
import sys

import pytest

GPT2 = "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512,n_positions=64"
USER_MODEL = '''
import torch, torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Module()  # a wrapper that only delegates
        self.inner.blocks = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 32, bias=False)
        self.head.weight = self.inner.blocks[0].weight  # tied with a block

    def forward(self, x):
        for b in self.inner.blocks:
            x = torch.tanh(b(x))
        return self.head(x).pow(2).mean()

def build():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 32),)
'''


def shardsched(*args, **kw):
    return subprocess.run([sys.executable, "-m", "shardsched", *args], capture_output=True, text=True, **kw)


def without_seconds(text: str) -> str:
    plan = json.loads(text)
    plan["solver"]["seconds"] = 0.0
    return json.dumps(plan, sort_keys=True)


@pytest.mark.parametrize("model", [GPT2, "python:usermodels:build"])
def test_same_command_same_plan(model, tmp_path):
    (tmp_path / "usermodels.py").write_text(USER_MODEL)
    args = ("plan", "--model", model, "--world", "8", "--device", "cpu", "--memory-budget", "3MiB",
            "--time-limit", "2", "--json")
    first, second = shardsched(*args, cwd=tmp_path), shardsched(*args, cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert without_seconds(first.stdout) == without_seconds(second.stdout)
    plan = json.loads(first.stdout)
    assert plan["units"][0]["layers"] == [""]  # the tied set lives in the root unit


def test_tied_parameters_split_by_a_plan_are_refused(tmp_path):
    (tmp_path / "usermodels.py").write_text(USER_MODEL)
    r = shardsched("plan", "--model", "python:usermodels:build", "--world", "8", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [u["layers"] for u in plan["units"]][0] == [""]
    # Hand-edit: give block 0 a unit of its own, splitting it from the head that shares its weight.
    plan["units"].insert(1, dict(plan["units"][1], name="inner.blocks.0", layers=["inner.blocks.0"]))
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    r = shardsched("plan", "--model", "python:usermodels:build", "--world", "8", "--plan", "bad.json", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "head.weight" in r.stderr and "inner.blocks.0.weight" in r.stderr


def test_warning_when_the_peak_exceeds_the_device():
    r = shardsched("plan", "--model", "hf:meta-llama/Llama-2-7b-hf", "--world", "1", "--device", "v100",
                   "--strategy", "replicate", "--json")
    assert r.returncode == 0, r.stderr
    peak = json.loads(r.stdout)["predicted"]["peak_bytes"]
    assert peak > 32 * 2**30  # 6.7B parameters x 16 bytes of model states alone
    lines = [line for line in r.stderr.splitlines() if "v100's 32 GiB" in line]
    assert len(lines) == 1 and f"{peak / 2**30:.2f} GiB" in lines[0]
    ok = shardsched("plan", "--model", GPT2, "--world", "8", "--device", "cpu", "--json")
    assert ok.returncode == 0 and "memory per worker" not in ok.stderr


def test_config_path_and_overrides(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = shardsched("plan", "--model", f"hf:{tmp_path}/config.json,num_hidden_layers=3", "--world", "8", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    h, f, kv = 64, 176, 2 * 16  # GQA: k and v project to 2 heads of 16
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert sum(u["params"] for u in plan["units"]) == 3 * block + 2 * 512 * h + h
    layers = [name for u in plan["units"] for name in u["layers"]]
    # The bare HF model's names (LlamaForCausalLM.model.layers.i), no wrapper prefix.
    assert [n for n in layers if re.fullmatch(r"model\.layers\.\d", n)] == [f"model.layers.{i}" for i in range(3)]


@pytest.mark.parametrize("spec, message", [
    ("hf:no-such/model", "unknown model 'no-such/model'"),
    ("hf:./missing/config.json", "cannot read config"),
    ("hf:{bad}", "is not JSON"),
    ("hf:gpt2,n_layr=4", "has no key 'n_layr'"),
    ("hf:gpt2,n_layer", "expected key=value"),
])
def test_bad_hf_input_is_one_line_and_exit_2(spec, message, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    r = shardsched("plan", "--model", spec.replace("{bad}", str(tmp_path / "bad.json")), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_forward_without_scalar_loss_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "vecmodel.py").write_text("import torch, torch.nn as nn\n"
                                          "def build():\n    return nn.Linear(4, 3), (torch.randn(2, 4),)\n")
    r = shardsched("plan", "--model", "python:vecmodel:build", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "scalar loss" in r.stderr
