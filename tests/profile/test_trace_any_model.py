"""Any model profiles on fake tensors: MoE experts (grouped matmul in fp32), models that
modify a module's output in place (traced and measured alike), and an op that cannot be
traced is named in one line. HF models are profiled and run with use_cache=False, said in
the profile's notes (issue 15)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.cost.device import DEVICES
from shardsched.errors import UsageError
from shardsched.models.spec import parse_model_spec
from shardsched.profile.measure import measure_profile
from shardsched.profile.trace import trace_profile

CPU = DEVICES["cpu"]
MIXTRAL = ("hf:mixtral,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
           "num_key_value_heads=2,num_local_experts=4,num_experts_per_tok=2,vocab_size=512,max_position_embeddings=64")
FALCON = "hf:falcon,num_hidden_layers=2,hidden_size=64,num_attention_heads=4,vocab_size=512"


class InPlaceBlock(nn.Module):
    """ResNet's pattern: the output of a child is modified in place (`+=`, inplace ReLU)."""

    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.body(x)
        out += x
        return self.act(out)


class InPlaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(InPlaceBlock(8) for _ in range(2))
        self.head = nn.Linear(8, 4)

    def forward(self, x, y):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h.mean((2, 3))), y)


def _same(traced, measured):
    assert [t.name for t in traced.layers] == [m.name for m in measured.layers]
    for t, m in zip(traced.layers, measured.layers):
        assert t.activation_bytes == m.activation_bytes, t.name
        assert abs(t.workspace_bytes - m.workspace_bytes) <= 1024, t.name


def test_moe_experts_trace_in_fp32_and_match_real_tensors():
    torch.set_num_threads(1)
    model, inputs = parse_model_spec(MIXTRAL).builder(micro_batch=2, seq=32, device="cpu")
    traced = trace_profile(model, inputs, name="mixtral", device=CPU)
    block = next(layer for layer in traced.layers if layer.name.endswith("layers.0"))
    # The experts' grouped matmuls: 64 tokens x 2 experts each, gate+up (64 -> 2x128) and down.
    experts = 2 * (64 * 2) * 64 * (2 * 128) + 2 * (64 * 2) * 128 * 64
    assert block.forward_flops["matmul"] >= experts
    # Fake and real tensors run the same program, attention included ([Note: HF causal masks
    # on fake tensors] in profile/trace_fake.py: no explicit mask, no repeated K/V, as in the run).
    _same(traced, measure_profile(model, inputs, name="mixtral", repeats=1, warmup=0))


@pytest.mark.parametrize("build", [lambda: parse_model_spec(FALCON).builder(micro_batch=2, seq=16, device="cpu"),
                                   lambda: (InPlaceNet(), (torch.randn(2, 3, 8, 8), torch.tensor([1, 2])))],
                         ids=["falcon", "inplace-resnet-block"])
def test_in_place_outputs_trace_and_measure(build):
    """Full backward hooks made these fail ("Output 0 of BackwardHookFunction is a view and is
    being modified inplace"); gradient hooks do not, and both profilers agree."""
    torch.set_num_threads(1)
    model, inputs = build()
    traced = trace_profile(model, inputs, name="m", device=CPU)
    assert len(traced.layers) >= 3
    _same(traced, measure_profile(model, inputs, name="m", repeats=1, warmup=0))


def test_an_op_that_cannot_be_traced_is_named():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            return y[y > 0].sum() + self.b(x).sum()

    with pytest.raises(UsageError) as e:
        trace_profile(DataDependent(), (torch.randn(2, 4),), name="dd", device=CPU)
    msg = str(e.value)
    assert "op aten." in msg and "--measure" in msg and "\n" not in msg


def test_hf_models_train_without_kv_cache_and_say_so():
    model, inputs = parse_model_spec(FALCON).builder(micro_batch=1, seq=8, device="meta")
    assert model.config.use_cache is False  # the bare HF model (models/hf_task.py)
    notes = trace_profile(model, inputs, name="falcon", device=CPU).extra["notes"]
    assert len(notes) == 1 and notes[0].startswith("use_cache=False set on FalconForCausalLM")


def test_python_model_holding_hf_model_gets_cache_off(tmp_path, monkeypatch):
    (tmp_path / "own_hf.py").write_text(
        "import torch\nfrom transformers import GPT2Config, GPT2LMHeadModel\n"
        "class Own(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256))\n"
        "    def forward(self, idx):\n"
        "        return self.lm(input_ids=idx, labels=idx).loss\n"
        "def build():\n"
        "    return Own(), (torch.zeros(1, 8, dtype=torch.long),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model, inputs = parse_model_spec("python:own_hf:build").builder()
    assert model.lm.config.use_cache is False
    assert "use_cache=False" in trace_profile(model, inputs, name="own", device=CPU).extra["notes"][0]


def test_train_console_says_use_cache_off(tmp_path):
    """`train` prints its task notes before workers start (train/validate.py): the note is one."""
    from shardsched.train.config import TrainConfig
    from shardsched.train.task import check_task
    cfg = TrainConfig(model=FALCON, seq=16, batch=2, run_dir=str(tmp_path / "run"))
    built, task = check_task(cfg, world=1)
    assert built.model.config.use_cache is False
    assert [n for n in task.notes if n.startswith("use_cache=False set on FalconForCausalLM")]


def test_hf_list_overrides_and_refused_values():
    from shardsched.models.hf import hf_config
    config = hf_config("resnet,hidden_sizes=[8,16,32,64],depths=[1,1,2,1],layer_type=bottleneck")
    assert (list(config.hidden_sizes), list(config.depths)) == ([8, 16, 32, 64], [1, 1, 2, 1])
    with pytest.raises(UsageError) as e:
        hf_config("resnet,hidden_sizes=wide")
    assert "refuses these values" in str(e.value) and "hidden_sizes" in str(e.value) and "\n" not in str(e.value)
