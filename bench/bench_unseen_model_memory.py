"""Predicted vs FSDPMemTracker peak on a model no test uses: a Qwen2 with tied embeddings and
grouped-query attention, held one attribute deep, at odd shapes (vocab 3001, hidden 96, seq 200,
micro-batch 3) and an odd world (12 = 3 nodes of 4), for checkpointed and node-aware plans.

    .venv/bin/python bench/bench_unseen_model_memory.py

Exit 1 when any error exceeds 5% (the HF suite's tolerance).
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardsched.cost.device import DEVICES, Cluster  # noqa: E402
from shardsched.models.spec import parse_model_spec  # noqa: E402
from shardsched.profile.trace import trace_profile  # noqa: E402
from shardsched.solve.build import make_plan  # noqa: E402
from tests.plan._fsdp2 import measured_peak  # noqa: E402


class Wrap(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.net = m

    def forward(self, *a):
        return self.net(*a)


SPEC = ("hf:qwen2,num_hidden_layers=3,hidden_size=96,intermediate_size=224,num_attention_heads=6,"
        "num_key_value_heads=2,vocab_size=3001,max_position_embeddings=512,tie_word_embeddings=true")


def main() -> int:
    torch.set_num_threads(2)
    spec = parse_model_spec(SPEC)

    def build(dev):
        m, i = spec.builder(micro_batch=3, seq=200, device=dev)
        return Wrap(m), i
    model, inputs = build("meta")
    profile = trace_profile(model, inputs, name="qwen2-odd", device=DEVICES["cpu"])
    cluster = Cluster(world=12, gpus_per_node=4, device=DEVICES["cpu"])
    worst = 0.0
    for strategy in ("full_shard+ckpt", "shard_grad_op+ckpt", "hybrid_shard", "full_shard/node+ckpt"):
        plan = make_plan(profile, cluster, strategy=strategy)
        model, inputs = build("cpu")
        measured = measured_peak(model, inputs, plan)
        err = plan.predicted.peak_bytes / measured - 1
        worst = max(worst, abs(err))
        print(f"{strategy:22s} layers per unit {[len(u.layers) for u in plan.units]}  "
              f"predicted {plan.predicted.peak_bytes / 2**20:7.2f} MiB  measured {measured / 2**20:7.2f} MiB  {err:+.1%}")
    print(f"worst error {worst:.1%} (target 5%)")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
