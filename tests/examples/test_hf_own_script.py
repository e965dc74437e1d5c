"""examples/hf_own_script.py as documented: `shardsched plan --model hf:X --out`, then the
user's own FSDP2 script under `torchrun --nproc-per-node 2` applies that plan to its own
`AutoModelForCausalLM.from_config(X)` (names and fingerprint match, no wrapper prefix)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_own_script.py"
SPEC = "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512"


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "plan.json"
    # the script's shape: 8 rows over 2 workers, 32 tokens
    r = subprocess.run([sys.executable, "-m", "shardsched", "plan", "--model", SPEC, "--world", "2", "--device", "cpu",
                        "--micro-batch", "4", "--seq", "32", "--memory-budget", "3MiB", "--out", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return path


def test_cli_plan_runs_in_own_torchrun_script(plan_path):
    from shardsched import load_plan
    plan = load_plan(str(plan_path))
    assert len({u.strategy for u in plan.units}) >= 2  # the budget forces a mixed plan
    torchrun = Path(sys.executable).parent / "torchrun"
    # --standalone: a free port of its own (29500, the default, may be taken by another run)
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), str(plan_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"(\d+) units \((.*?)\); loss ([\d.]+) -> ([\d.]+)", r.stdout)
    assert m, r.stdout
    assert int(m.group(1)) == len(plan.units)
    assert m.group(2).split(", ") == [u.strategy.value + u.checkpoint.suffix for u in plan.units]
    first, last = float(m.group(3)), float(m.group(4))
    assert abs(first - 6.238) < 0.3 and last < first - 1.0  # ln(512) = 6.238 at start; it learns


def test_plan_names_are_the_bare_models(plan_path):
    from transformers import AutoModelForCausalLM, GPT2Config

    from shardsched import UsageError, check_plan, load_plan
    from shardsched.profile.fingerprint import fingerprint
    plan = load_plan(str(plan_path))
    mine = AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512))
    assert plan.fingerprint == fingerprint(mine)
    names = {n for n, _ in mine.named_modules()}
    assert all(layer in names for u in plan.units for layer in u.layers)
    check_plan(mine, plan, 2)  # no error
    other = AutoModelForCausalLM.from_config(GPT2Config(n_layer=3, n_embd=64, n_head=2, vocab_size=512))
    with pytest.raises(UsageError, match="made for another model"):
        check_plan(other, plan, 2)


def test_llama_plan_names_have_one_model_prefix():
    """LlamaForCausalLM holds `model` itself: the plan names `model.layers.i`, not `model.model.layers.i`."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from shardsched.models.hf import hf_builder
    from shardsched.profile.fingerprint import fingerprint
    build = hf_builder("llama,num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=2,"
                          "num_key_value_heads=2,vocab_size=256")[0]
    ours, _ = build(micro_batch=1, seq=8)
    theirs = AutoModelForCausalLM.from_config(LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256))
    assert fingerprint(ours) == fingerprint(theirs)
    assert "model.layers.1" in dict(ours.named_modules()) and "model.model" not in dict(ours.named_modules())
