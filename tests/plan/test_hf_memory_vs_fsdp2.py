"""Any model: plans for Hugging Face models (tied embeddings, GQA, MLM, seq2seq, vision),
plain and wrapped one level deep, run on FSDP2 at worlds 8 and 64, and the predicted peak
against FSDPMemTracker's. The profile is traced on fake tensors (profile/trace.py). The goal
is 3% and the test asserts it (issue 15: every moment derived from the traced program,
docs/design.md "Moments derived from the program"): -1.1..+1.3% here, -1.7..+0.0% on the new
families (`NEW_FAMILIES`: MoE, in-place ops, a shared layer, speech, at realistic vocabularies).

Run with -s for the table (model, wrapping, world, strategy, units, measured, predicted, error).
"""
import pytest
import torch
import torch.nn as nn

from shardsched.cost.device import DEVICES, Cluster
from shardsched.models.spec import parse_model_spec
from shardsched.profile.trace import trace_profile
from shardsched.solve.build import make_plan
from ._fsdp2 import measured_peak

MODELS = {
    "gpt2 (tied)": "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=512,n_positions=64",
    "qwen2 (tied, GQA)": "hf:qwen2,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
                         "num_key_value_heads=2,vocab_size=512,max_position_embeddings=64,tie_word_embeddings=true",
    "llama (GQA)": "hf:llama,num_hidden_layers=2,hidden_size=64,intermediate_size=176,num_attention_heads=4,"
                   "num_key_value_heads=2,vocab_size=512,max_position_embeddings=64",
    "bert (MLM, tied)": "hf:bert,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2,"
                        "vocab_size=512,max_position_embeddings=64",
    "t5 (seq2seq, tied)": "hf:t5,num_layers=2,num_decoder_layers=2,d_model=64,d_ff=128,d_kv=16,num_heads=4,"
                          "vocab_size=512",
    "vit": "hf:vit,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2,image_size=32,"
           "patch_size=8,num_labels=10",
}
# Families no other test uses, at their real vocabularies (Gemma-2's 256k and Qwen2-MoE's 152k
# are cut to 32k and 64k to keep the run short) and tiny widths: MoE experts (grouped matmul),
# in-place ops (Falcon, ResNet), a shared layer (ALBERT), speech seq2seq (Whisper). Every plan
# must plan and run within 3% (issue 15); the test prints the table.
NEW_FAMILIES = {
    "mixtral (MoE)": "hf:mixtral,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
                     "num_key_value_heads=2,num_local_experts=4,num_experts_per_tok=2,vocab_size=32000,"
                     "max_position_embeddings=64",
    "qwen2-moe": "hf:qwen2_moe,num_hidden_layers=2,hidden_size=64,intermediate_size=128,moe_intermediate_size=64,"
                 "shared_expert_intermediate_size=128,num_experts=4,num_experts_per_tok=2,num_attention_heads=4,"
                 "num_key_value_heads=2,vocab_size=65536,max_position_embeddings=64",
    "olmoe": "hf:olmoe,num_hidden_layers=2,hidden_size=64,intermediate_size=64,num_experts=4,num_experts_per_tok=2,"
             "num_attention_heads=4,num_key_value_heads=4,vocab_size=50304,max_position_embeddings=64",
    "phi-3": "hf:phi3,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
             "num_key_value_heads=4,vocab_size=32064,max_position_embeddings=64,original_max_position_embeddings=64,"
             "pad_token_id=0",
    "gpt-neox": "hf:gpt_neox,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
                "vocab_size=50432,max_position_embeddings=64",
    "opt": "hf:opt,num_hidden_layers=2,hidden_size=64,ffn_dim=128,num_attention_heads=4,word_embed_proj_dim=64,"
           "vocab_size=50272,max_position_embeddings=64",
    "falcon (in-place)": "hf:falcon,num_hidden_layers=2,hidden_size=64,num_attention_heads=4,vocab_size=65024",
    "gemma-2": "hf:gemma2,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
               "num_key_value_heads=2,head_dim=16,vocab_size=32768,max_position_embeddings=64",
    "albert (shared layer)": "hf:albert,num_hidden_layers=2,hidden_size=64,intermediate_size=128,"
                             "num_attention_heads=4,embedding_size=32,vocab_size=30000,max_position_embeddings=64",
    "whisper (speech)": "hf:whisper,encoder_layers=2,decoder_layers=2,d_model=64,encoder_ffn_dim=128,"
                        "decoder_ffn_dim=128,encoder_attention_heads=4,decoder_attention_heads=4,vocab_size=51865,"
                        "max_source_positions=32,max_target_positions=64,num_mel_bins=16",
    "resnet (in-place)": "hf:resnet,embedding_size=16,hidden_sizes=[16,32,64,128],depths=[1,1,2,1],"
                         "layer_type=bottleneck,num_labels=1000",
}
NEW_TOLERANCE = 0.03  # the goal: misses are marked *** in the table
NEW_BOUND = NEW_TOLERANCE  # measured -1.7..+0.0% (99 plans)
STRATEGIES = ("replicate", "shard_grad_op", "full_shard", "auto")
TOLERANCE = 0.03  # measured -1.1..+1.3% (issue 15)
WRAPS = ((False, (8, 64)), (True, (64,)))


class Wrapper(nn.Module):
    """How training code often holds a model: one attribute deep."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


def build(spec, *, wrapped: bool, device: str):
    model, inputs = spec.builder(micro_batch=2, seq=32, device=device)
    return (Wrapper(model) if wrapped else model), inputs


def plans(profile, world: int, extra: tuple[str, ...] = ()) -> dict:
    cluster = Cluster(world=world, gpus_per_node=8, device=DEVICES["cpu"])
    out = {s: make_plan(profile, cluster, strategy=s) for s in STRATEGIES[:3] + extra}
    # A middle budget: halfway between the uniform extremes makes auto mix strategies.
    peaks = [out[s].predicted.peak_bytes for s in STRATEGIES[:3]]
    out["auto"] = make_plan(profile, cluster, strategy="auto", memory_budget_bytes=(max(peaks) + min(peaks)) // 2,
                            time_limit=1.0)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_hf_plans_run_on_fsdp2_and_peaks_match(name):
    torch.set_num_threads(1)
    spec = parse_model_spec(MODELS[name])
    rows = []
    for wrapped, worlds in WRAPS:
        model, inputs = build(spec, wrapped=wrapped, device="meta")
        profile = trace_profile(model, inputs, name=name, device=DEVICES["cpu"])
        assert len(profile.layers) >= 4, [layer.name for layer in profile.layers]  # found through the wrappers
        for world in worlds:
            for strategy, plan in plans(profile, world).items():
                model, inputs = build(spec, wrapped=wrapped, device="cpu")
                measured = measured_peak(model, inputs, plan)
                err = plan.predicted.peak_bytes / measured - 1
                units = ",".join(f"{u.strategy.value[:3]}" for u in plan.units)
                rows.append((name, "wrapped" if wrapped else "plain", world, strategy, units, measured,
                             plan.predicted.peak_bytes, err))
    for r in rows:
        print(f"{r[0]:20s} {r[1]:8s} world={r[2]:3d} {r[3]:14s} units={r[4]:32s} measured={r[5] / 2**20:7.3f} MiB "
              f"predicted={r[6] / 2**20:7.3f} MiB error={r[7]:+.1%}")
    bad = [r for r in rows if abs(r[7]) > TOLERANCE]
    assert not bad, f"predicted peak off by more than {TOLERANCE:.0%}: {bad}"


def _row_line(r) -> str:
    flag = " ***" if abs(r[7]) > NEW_TOLERANCE else ""
    return (f"{r[0]:22s} {r[1]:8s} world={r[2]:3d} {r[3]:15s} units={r[4]:32s} measured={r[5] / 2**20:8.3f} MiB "
            f"predicted={r[6] / 2**20:8.3f} MiB error={r[7]:+.1%}{flag}")


@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_new_families_plan_and_run(name):
    """Every plan of the new families plans and runs on FSDP2 (worlds 8 and 64, every uniform
    strategy, checkpointed full_shard, auto; replicate at world 8 only); errors beyond 3% are
    marked *** in the table."""
    torch.set_num_threads(1)
    spec = parse_model_spec(NEW_FAMILIES[name])
    model, inputs = spec.builder(micro_batch=2, seq=32, device="meta")
    profile = trace_profile(model, inputs, name=name, device=DEVICES["cpu"])
    assert len(profile.layers) >= 3, [layer.name for layer in profile.layers]
    rows = []
    for world in (8, 64):
        for strategy, plan in plans(profile, world, extra=("full_shard+ckpt",)).items():
            if strategy == "replicate" and world != 8:
                continue  # replicate holds the same bytes at every world (measured: identical rows)
            model, inputs = spec.builder(micro_batch=2, seq=32, device="cpu")
            measured = measured_peak(model, inputs, plan)
            units = ",".join(f"{u.strategy.value[:3]}{'+ck' if u.checkpoint else ''}" for u in plan.units)
            rows.append((name, "plain", world, strategy, units[:32], measured, plan.predicted.peak_bytes,
                         plan.predicted.peak_bytes / measured - 1))
    for r in rows:
        print(_row_line(r))
    assert not [r for r in rows if abs(r[7]) > NEW_BOUND], rows
